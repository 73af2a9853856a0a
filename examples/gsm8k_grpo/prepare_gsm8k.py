"""Turn a downloaded copy of openai/gsm8k into the taskset this example reads.

Usage:
    python examples/gsm8k_grpo/prepare_gsm8k.py RAW_DIR OUT_DIR [--subset main]

RAW_DIR is the dataset as the Hub stores it (`main/train-00000-of-00001.parquet`,
`main/test-00000-of-00001.parquet`; jsonl works too), e.g. after
`huggingface-cli download openai/gsm8k --repo-type dataset --local-dir RAW_DIR`.
OUT_DIR gets `train.jsonl` and `test.jsonl` with the columns the config names:

    {"question": "...", "answer": "72", "solution": "<GSM8K's worked solution>"}

GSM8K's `answer` column is a worked solution ending in `#### 72`; math_reward compares the model's
\\boxed{} number with the truth column, so the truth must be the number alone.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from services.buffer.taskfile import load_rows  # noqa: E402  (the reader the buffer itself uses)

SPLITS = ("train", "test")


def final_answer(solution: str) -> str:
    """The number after GSM8K's `####` marker, thousands separators removed ("#### 1,234" -> "1234")."""
    if "####" not in solution:
        raise ValueError(f"no '####' marker in GSM8K answer: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def convert_row(row: dict[str, Any]) -> dict[str, str]:
    return {
        "question": row["question"].strip(),
        "answer": final_answer(row["answer"]),
        "solution": row["answer"],
    }


def prepare(raw_dir: str, out_dir: str, *, subset: str | None = "main") -> dict[str, int]:
    """Write OUT_DIR/<split>.jsonl for train and test; returns the row count per split."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in SPLITS:
        rows = [convert_row(r) for r in load_rows(raw_dir, split=split, subset_name=subset)]
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        counts[split] = len(rows)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="openai/gsm8k -> train.jsonl / test.jsonl for math_workflow")
    parser.add_argument("raw_dir", help="downloaded openai/gsm8k (HF layout)")
    parser.add_argument("out_dir", help="taskset folder (the config's GSM8K_PATH)")
    parser.add_argument(
        "--subset", default="main", help="subset folder under RAW_DIR (default main; '' for none)"
    )
    args = parser.parse_args(argv)
    counts = prepare(args.raw_dir, args.out_dir, subset=args.subset or None)
    print(f"wrote {args.out_dir}: " + ", ".join(f"{split} {n} rows" for split, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
