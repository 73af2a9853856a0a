"""What a run directory holds, read without changing anything in it.

A run launched by `trinity run` is `<checkpoint_root_dir>/<project>/<name>/`: summary.json at the
top and, for a config with `stages:`, one directory per stage (`sft/`, `grpo/`), each with the
stage's config.resolved.yaml, buffer/*.sqlite, trainer/progress.jsonl, explorer/progress-*.jsonl,
eval/results.jsonl and logs/children.json (the pids of the services it started). A run without
stages is its own single stage. `--config F` names the same directories through the config.
"""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from services.common.config import TrinityConfig, load_config
from services.common.errors import ConfigError, InvalidArgument, NotFound, TrinityError

RESOLVED = "config.resolved.yaml"
# Buffer kinds that hold experiences (tasksets hold tasks).
ITEM_KINDS = ("fifo", "priority", "table")


def open_readonly(path: str | pathlib.Path) -> sqlite3.Connection:
    """A read-only connection: the viewer never writes a buffer's file (the buffer owns it)."""
    uri = pathlib.Path(path).absolute().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=2000")
    return conn


@dataclass(frozen=True)
class BufferFile:
    """One experience buffer's SQLite file."""

    name: str
    kind: str
    path: pathlib.Path


def buffer_spec(path: pathlib.Path) -> dict[str, Any] | None:
    """The spec a buffer file was created with (its `meta` row), or None for another SQLite file."""
    try:
        conn = open_readonly(path)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'spec'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    if row is None:
        return None
    try:
        spec = json.loads(row[0])
    except ValueError:
        return None
    return spec if isinstance(spec, dict) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


@dataclass
class Stage:
    """One stage of a run: its directory and, when readable, its config."""

    name: str
    path: pathlib.Path
    cfg: TrinityConfig | None = None
    cfg_error: str = ""

    @property
    def data_dir(self) -> pathlib.Path:
        """buffer.data_dir when the config sets one, else <stage>/buffer."""
        if self.cfg is not None and self.cfg.buffer.data_dir:
            return pathlib.Path(self.cfg.buffer.data_dir)
        return self.path / "buffer"

    def buffer_files(self) -> list[BufferFile]:
        """Every experience buffer (fifo, priority, table) of the stage, by name."""
        candidates = sorted(self.data_dir.glob("*.sqlite")) if self.data_dir.is_dir() else []
        if self.cfg is not None:
            st = self.cfg.buffer.trainer_input
            for storage in [st.experience_buffer, *st.auxiliary_buffers.values()]:
                if storage.storage_type != "file" and storage.path:
                    candidates.append(pathlib.Path(storage.path.removeprefix("sqlite:///")))
        found: dict[str, BufferFile] = {}
        for path in candidates:
            spec = buffer_spec(path) if path.is_file() else None
            if spec is not None and spec.get("kind") in ITEM_KINDS:
                name = str(spec.get("name") or path.stem)
                found.setdefault(name, BufferFile(name, str(spec["kind"]), path))
        return sorted(found.values(), key=lambda b: b.name)

    def live_pids(self) -> dict[str, int]:
        """The services `trinity run` started for this stage that are still running."""
        try:
            children = json.loads((self.path / "logs" / "children.json").read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(children, dict):
            return {}
        return {str(k): int(v) for k, v in children.items() if isinstance(v, int) and pid_alive(v)}

    def trainer_tail(self, count: int) -> list[dict[str, Any]]:
        """The trainer's last `count` step records (trainer/progress.jsonl)."""
        return [r for r in tail_records(self.path / "trainer" / "progress.jsonl", count) if "step" in r]

    def explorer_tails(self, count: int) -> dict[str, list[dict[str, Any]]]:
        """Each explorer's last `count` step records, by explorer name."""
        return {
            path.stem.removeprefix("progress-"): [r for r in tail_records(path, count) if "step" in r]
            for path in sorted((self.path / "explorer").glob("progress-*.jsonl"))
        }

    @property
    def total_steps(self) -> int | None:
        return self.cfg.buffer.total_steps if self.cfg is not None else None


# Configs already read, by (path, mtime_ns): the viewer re-reads a live run's directory every few
# seconds and a config takes ~50 ms to validate.
_CONFIGS: dict[tuple[str, int], TrinityConfig | str] = {}


def _resolved_config(resolved: pathlib.Path) -> TrinityConfig | str:
    """The config in a file (a stage's config.resolved.yaml, or --config), or why it cannot be read."""
    if not resolved.is_file():
        return f"config file not found: {resolved}"
    key = (str(resolved), resolved.stat().st_mtime_ns)
    if key not in _CONFIGS:
        try:
            _CONFIGS[key] = load_config(str(resolved))
        except TrinityError as exc:
            _CONFIGS[key] = f"{resolved}: {exc}"
    return _CONFIGS[key]


def _stage_of(name: str, path: pathlib.Path, cfg: TrinityConfig | None = None) -> Stage:
    if cfg is not None:
        return Stage(name, path, cfg)
    resolved = path / RESOLVED
    if not resolved.is_file():
        return Stage(name, path, None, f"no {RESOLVED} in {path}")
    got = _resolved_config(resolved)
    return Stage(name, path, got) if isinstance(got, TrinityConfig) else Stage(name, path, None, got)


def tail_records(path: pathlib.Path, count: int, *, window: int = 1 << 20) -> list[dict[str, Any]]:
    """The last `count` JSON records of a JSON-lines file, reading at most its last `window` bytes
    (progress files grow all run long; the overview needs their end only)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - window))
            data = fh.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > window:
        lines = lines[1:]  # the first line is cut
    out: list[dict[str, Any]] = []
    for line in reversed(lines):
        if len(out) == count:
            break
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out[::-1]


def _looks_like_stage(path: pathlib.Path) -> bool:
    return any((path / p).exists() for p in (RESOLVED, "buffer", "trainer", "explorer"))


@dataclass
class Run:
    """A run: its top directory, its stages in order, and summary.json."""

    root: pathlib.Path
    stages: list[Stage] = field(default_factory=list)
    from_config: bool = False

    def summary(self) -> dict[str, Any]:
        try:
            data = json.loads((self.root / "summary.json").read_text())
        except (OSError, ValueError):
            return {"stages": []}
        return data if isinstance(data, dict) else {"stages": []}

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        known = ", ".join(s.name for s in self.stages)
        raise NotFound(f"no stage {name!r} in this run; stages: {known}", field="stage")


def open_run(run_dir: str | None = None, config: str | None = None) -> Run:
    """The run at RUN_DIR, or the one a config file describes; InvalidArgument when it is neither."""
    if (run_dir is None) == (config is None):
        raise InvalidArgument("give the run directory or --config FILE (one of them)", field="run_dir")
    if config is not None:
        got = _resolved_config(pathlib.Path(config))
        if isinstance(got, str):
            raise ConfigError(got, field="config")
        cfg = got
        labels = [s.stage_name for s in cfg.stages] or [pathlib.Path(cfg.run_dir).name]
        stages = [
            _stage_of(label, pathlib.Path(sc.run_dir), sc)
            for label, sc in zip(labels, cfg.stage_configs, strict=True)
        ]
        return Run(pathlib.Path(cfg.run_dir), stages, from_config=True)
    root = pathlib.Path(str(run_dir))
    if not root.is_dir():
        raise InvalidArgument(f"{root} is not a directory", field="run_dir")
    if _looks_like_stage(root):
        return Run(root, [_stage_of(root.name, root)])
    summary_names = [str(s.get("name")) for s in Run(root).summary().get("stages", []) if isinstance(s, dict)]
    dirs = {p.name: p for p in root.iterdir() if p.is_dir() and _looks_like_stage(p)}
    order = [n for n in summary_names if n in dirs] + sorted(set(dirs) - set(summary_names))
    if not order:
        raise InvalidArgument(
            f"{root} is not a run directory: no {RESOLVED}, buffer/ or trainer/ in it or in a stage "
            "directory under it (give <checkpoint_root_dir>/<project>/<name>)",
            field="run_dir",
        )
    return Run(root, [_stage_of(name, dirs[name]) for name in order])
