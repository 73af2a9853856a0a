"""Data of the embedded demo, generated locally on first use (no downloads).

The demo shows what reinforcement learning adds where supervised fine-tuning cannot follow:
- `sft.jsonl`: 1,000 labelled *easier* problems (3-digit additions with at most one carry):
  SFT teaches the format and single carries;
- `rl.jsonl`: 8,000 *harder* problems (two or three carries) used without their labels: GRPO
  learns from the verifier's reward alone (the answers are there only for the reward function);
- `eval.jsonl`: 1,000 held-out problems of the harder kind, scored before, between and after.
Every file is deterministic (fixed seeds), and the three sets share no question.

    python -m services.cli.demo_data DIR     # what `trinity run` does for the embedded default
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from services.tasks.arith import ArithSpec, generate, write_jsonl


@dataclass(frozen=True)
class DemoSet:
    file: str
    spec: ArithSpec
    n: int
    seed: int


# Sizes and difficulty were chosen with examples/demo/sizing_probe.py (see docs/demo-sizing.md).
EVAL = DemoSet("eval.jsonl", ArithSpec(digits=3, min_carries=2), 1000, seed=11)
SFT = DemoSet("sft.jsonl", ArithSpec(digits=3, max_carries=1), 1000, seed=12)
RL = DemoSet("rl.jsonl", ArithSpec(digits=3, min_carries=2), 8000, seed=13)


def prepare_demo_data(data_dir: str) -> list[str]:
    """Write the demo's files into `data_dir` unless present; returns the paths written."""
    written: list[str] = []
    used: set[str] = set()
    for demo_set in (EVAL, SFT, RL):  # eval first: the others exclude its questions
        path = os.path.join(data_dir, demo_set.file)
        rows = generate(demo_set.spec, demo_set.n, demo_set.seed, exclude=used)
        used.update(row["question"] for row in rows)
        if not os.path.exists(path):
            write_jsonl(rows, path + ".tmp")  # whole files only: a killed run leaves no half file
            os.replace(path + ".tmp", path)
            written.append(path)
    return written


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "."
    for p in prepare_demo_data(target):
        print(p)
