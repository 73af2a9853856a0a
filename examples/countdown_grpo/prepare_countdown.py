"""Turn a downloaded copy of Jiayi-Pan/Countdown-Tasks-3to4 into the taskset this example reads.

Usage:
    python examples/countdown_grpo/prepare_countdown.py RAW_DIR OUT_DIR [--test-size 512] [--train-size N]

RAW_DIR is the dataset as the Hub stores it (`data/train-00000-of-00001.parquet`, columns
`target` and `nums`; jsonl works too), e.g. after
`huggingface-cli download Jiayi-Pan/Countdown-Tasks-3to4 --repo-type dataset --local-dir RAW_DIR`.
It has only a train split: the last `--test-size` rows become the test split. OUT_DIR gets
`train.jsonl` and `test.jsonl`:

    {"question": "Using the numbers [3, 5, 7], create an equation that equals 22. ...",
     "answer": "{\"numbers\": [3, 5, 7], \"target\": 22}"}

countdown_reward reads the truth column as that JSON object and scores the last
<answer>...</answer> of the response: 1 when it uses every number exactly once and equals the
target, 0.1 when it is a well-formed equation that does not.
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

# TinyZero's prompt for instruct models (the system prompt lives in config.yaml).
PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
    "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> tags. "
    "And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)


def convert_row(row: dict[str, Any]) -> dict[str, str]:
    numbers = [int(n) for n in row["nums"]]
    target = int(row["target"])
    return {
        "question": PROMPT.format(numbers=numbers, target=target),
        "answer": json.dumps({"numbers": numbers, "target": target}),
    }


def prepare(
    raw_dir: str, out_dir: str, *, test_size: int = 512, train_size: int | None = None
) -> dict[str, int]:
    """Write OUT_DIR/train.jsonl and OUT_DIR/test.jsonl; returns the row count per split."""
    rows = [convert_row(r) for r in load_rows(raw_dir, split="train")]
    if test_size >= len(rows):
        raise ValueError(f"--test-size {test_size} leaves no training rows (the dataset has {len(rows)})")
    splits = {"train": rows[: len(rows) - test_size], "test": rows[len(rows) - test_size :]}
    if train_size is not None:
        splits["train"] = splits["train"][:train_size]
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, split_rows in splits.items():
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as fh:
            for row in split_rows:
                fh.write(json.dumps(row) + "\n")
    return {split: len(split_rows) for split, split_rows in splits.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Countdown-Tasks-3to4 -> train.jsonl / test.jsonl for countdown_workflow"
    )
    parser.add_argument("raw_dir", help="downloaded Jiayi-Pan/Countdown-Tasks-3to4 (HF layout)")
    parser.add_argument("out_dir", help="taskset folder (the config's COUNTDOWN_PATH)")
    parser.add_argument(
        "--test-size", type=int, default=512, help="rows held out as the test split (default 512)"
    )
    parser.add_argument("--train-size", type=int, default=None, help="keep only the first N training rows")
    args = parser.parse_args(argv)
    counts = prepare(args.raw_dir, args.out_dir, test_size=args.test_size, train_size=args.train_size)
    print(f"wrote {args.out_dir}: " + ", ".join(f"{split} {n} rows" for split, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
