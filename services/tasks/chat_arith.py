r"""The chat-model arithmetic task set: "What is $63 + 2$? Give the final answer as a LaTeX \boxed{} expression."

Every problem a + b with a in 10..99 and b in 2..9 (720 in all). A fixed held-out split of 200 problems
(a seeded shuffle, the same on every machine) is never in the training file, so held-out accuracy
measures generalisation to unseen sums, not recall. Rows are `{"question": ..., "answer": "65"}`; the
files are read through the normal taskset config (`prompt_key: question`, `response_key: answer`).

The prompt carries no example answer: a small model given one learns to box the example (see
services/explorer/rewards/shaped.py). It asks for "a LaTeX \boxed{} expression" of a question written
in LaTeX because GRPO learns the boxed format only from groups in which some samples box and others
do not: under this wording the untrained SmolLM2-135M boxes often enough that the format is in most
groups from the start, where "Put your final answer in \boxed{}." left most groups flat
(benchmarks/README.md, "SmolLM2 task and reward"; benchmarks/smollm2_prompt_wording.py measures
it). Replies are read by services/explorer/rewards/answers.py. `chat_messages` builds the one user
message from the question alone; `render_prompt` renders it with the model's own chat template.
Neither ever sees the answer. `python -m services.tasks.chat_arith OUT_DIR` writes train.jsonl and heldout.jsonl.
"""

from __future__ import annotations

import json
import pathlib
import random
import sys
from typing import Any, Protocol

from services.common.errors import InvalidArgument

QUESTION = "What is ${a} + {b}$? Give the final answer as a LaTeX \\boxed{{}} expression."
FIRST_WORDING = "What is {a} + {b}? Put your final answer in \\boxed{{}}."
"""The first wording, under which groups settled on the right number unboxed (the stall dynamic
sampling is measured against: examples/smollm2_grpo/dapo_first_wording.yaml)."""
WORDINGS = {"latex": QUESTION, "first": FIRST_WORDING}
A_RANGE = range(10, 100)
B_RANGE = range(2, 10)
HELDOUT_SIZE = 200
SPLIT_SEED = 0


class ChatTemplate(Protocol):
    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...


def all_rows(wording: str = "latex") -> list[dict[str, str]]:
    """Every problem, in a fixed order, asked in one of WORDINGS."""
    if wording not in WORDINGS:
        raise InvalidArgument(f"wording must be one of {sorted(WORDINGS)}, got {wording!r}", field="wording")
    template = WORDINGS[wording]
    return [{"question": template.format(a=a, b=b), "answer": str(a + b)} for a in A_RANGE for b in B_RANGE]


def split_rows(
    heldout_size: int = HELDOUT_SIZE, seed: int = SPLIT_SEED, wording: str = "latex"
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, heldout): disjoint, heldout fixed by `seed` (the same problems in every wording)."""
    rows = all_rows(wording)
    if not 0 < heldout_size < len(rows):
        raise InvalidArgument(
            f"heldout_size must be in 1..{len(rows) - 1}, got {heldout_size}", field="heldout_size"
        )
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[:heldout_size])
    train = [rows[i] for i in order[heldout_size:]]
    heldout = [rows[i] for i in sorted(held)]
    return train, heldout


def write_tasksets(out_dir: str | pathlib.Path, wording: str = "latex") -> dict[str, pathlib.Path]:
    """train.jsonl and heldout.jsonl under `out_dir` (rewritten identically on every call)."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, pathlib.Path] = {}
    for name, rows in zip(("train", "heldout"), split_rows(wording=wording), strict=True):
        path = out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths[name] = path
    return paths


def chat_messages(row: dict[str, str]) -> list[dict[str, str]]:
    """The conversation for one row: its question as the single user message (no answer, no example)."""
    if "question" not in row:
        raise InvalidArgument(f"a row needs a 'question' key; it has {sorted(row)}", field="question")
    return [{"role": "user", "content": row["question"]}]


def render_prompt(tokenizer: ChatTemplate, row: dict[str, str]) -> str:
    """The prompt text the model sees: its chat template over `chat_messages(row)`, generation prompt on."""
    text = tokenizer.apply_chat_template(chat_messages(row), tokenize=False, add_generation_prompt=True)
    return str(text)


if __name__ == "__main__":
    args = sys.argv[1:]
    wording = "latex"
    if len(args) == 3 and args[1] == "--wording":
        wording = args[2]
    elif len(args) != 1:
        sys.exit(f"usage: python -m services.tasks.chat_arith OUT_DIR [--wording {'|'.join(WORDINGS)}]")
    if wording not in WORDINGS:
        sys.exit(f"--wording must be one of {', '.join(WORDINGS)}, got {wording!r}")
    for split, file in write_tasksets(args[0], wording).items():
        print(f"{split}: {file}")
