"""Reading task rows from a jsonl / json / parquet file or a Hugging Face datasets directory.

The directory layout is the one `datasets.save_to_disk`-free repos use on the Hub:
`<path>[/<subset_name>]/` holding files whose name starts with the split (`train.jsonl`,
`test-00000-of-00001.parquet`), possibly under `data/`, or a folder named after the split.
Rows of all matching files are concatenated in file-name order. No `datasets` import: the
buffer must start fast and stay light.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from services.common.errors import InvalidArgument

SUFFIXES = (".jsonl", ".json", ".parquet")


def load_rows(path: str, *, split: str = "train", subset_name: str | None = None) -> list[dict[str, Any]]:
    """All rows of the taskset as dicts, in file order."""
    p = pathlib.Path(path).expanduser()
    if p.is_file():
        return read_file(p)
    if not p.is_dir():
        raise InvalidArgument(f"taskset path {path!r} does not exist", field="path")
    base = p / subset_name if subset_name else p
    if not base.is_dir():
        raise InvalidArgument(f"subset {subset_name!r} not found under {path!r}", field="subset_name")
    files = split_files(base, split)
    if not files:
        found = sorted(f.name for f in base.rglob("*") if f.suffix in SUFFIXES)
        raise InvalidArgument(f"no files of split {split!r} under {base} (found {found[:10]})", field="split")
    rows: list[dict[str, Any]] = []
    for f in files:
        rows.extend(read_file(f))
    return rows


def task_id_of(row: dict[str, Any], index: int) -> str:
    """A row's task id: its `task_id` column, else its `id` column, else its index in the file."""
    return str(row.get("task_id", row.get("id", index)))


def split_files(base: pathlib.Path, split: str) -> list[pathlib.Path]:
    matches = []
    for folder in (base, base / "data"):
        if not folder.is_dir():
            continue
        matches += [
            f for f in folder.iterdir() if f.is_file() and f.suffix in SUFFIXES and _is_split(f.name, split)
        ]
        split_dir = folder / split
        if split_dir.is_dir():
            matches += [f for f in split_dir.iterdir() if f.is_file() and f.suffix in SUFFIXES]
    return sorted(set(matches))


def _is_split(name: str, split: str) -> bool:
    stem = name.split(".")[0]
    return stem == split or stem.startswith(f"{split}-") or stem.startswith(f"{split}_")


def read_file(f: pathlib.Path) -> list[dict[str, Any]]:
    if f.suffix == ".parquet":
        import pyarrow.parquet as pq  # imported here: only tasksets in parquet pay for it

        return list(pq.read_table(f).to_pylist())
    text = f.read_text(encoding="utf-8")
    if f.suffix == ".json" and text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise InvalidArgument(f"{f}:{lineno}: not a JSON line: {exc}", field="path") from exc
    bad = [i for i, r in enumerate(rows) if not isinstance(r, dict)]
    if bad:
        raise InvalidArgument(f"{f}: row {bad[0]} is not a JSON object", field="path")
    return rows
