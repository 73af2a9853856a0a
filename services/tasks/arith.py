"""Synthetic arithmetic tasks: deterministic by seed, checkable by exact match (the CPU demo's task).

A row is `{"question": "047+385=", "answer": "0432"}`: operands are zero-padded to `digits`, and
the answer is zero-padded to the widest result the settings allow (4 characters for two 3-digit
operands), so every answer of a taskset has the same length and the model never has to guess it.
`reverse_answer` writes the answer least-significant digit first ("2340"), which makes carries
local and addition much easier for a small left-to-right model.

Difficulty knobs (`ArithSpec`): `digits`, `operands`, `op` (+ or -), `min_carries`/`max_carries`
(number of digit columns of an addition that produce a carry), `max_value` (caps every operand,
e.g. 99 with digits=3 gives "047+038=" style problems), `reverse_answer`.

`answer_reward(response, answer)` is the verifier: 1.0 when the text before the first EOS
(whitespace removed: the one answer reader's `plain_answer`, as `arith_reward` reads it) is exactly
the answer, else 0.0. `digit_reward` gives partial credit per correct character.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random
from collections.abc import Iterable, Iterator

from services.common.errors import InvalidArgument
from services.explorer.rewards.answers import plain_answer

EOS_TEXT = "<eos>"


@dataclasses.dataclass(frozen=True)
class ArithSpec:
    """How to draw one problem. All fields are validated in `__post_init__`."""

    digits: int = 3
    """Digits per operand (operands are zero-padded to this width)."""
    operands: int = 2
    """Number of operands (>= 2)."""
    op: str = "+"
    """'+' or '-' (subtraction keeps results >= 0 by sorting operands, largest first)."""
    min_carries: int = 0
    """Addition only: reject problems with fewer carrying digit columns."""
    max_carries: int | None = None
    """Addition only: reject problems with more carrying digit columns (None: no limit)."""
    max_value: int | None = None
    """Largest operand value (None: 10**digits - 1)."""
    reverse_answer: bool = False
    """Write the answer least-significant digit first."""

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 12:
            raise InvalidArgument(f"digits must be in [1, 12], got {self.digits}", field="digits")
        if not 2 <= self.operands <= 8:
            raise InvalidArgument(f"operands must be in [2, 8], got {self.operands}", field="operands")
        if self.op not in ("+", "-"):
            raise InvalidArgument(f"op must be '+' or '-', got {self.op!r}", field="op")
        if self.op == "-" and (self.min_carries or self.max_carries is not None):
            raise InvalidArgument("carry limits apply to addition only", field="min_carries")
        if self.max_carries is not None and self.max_carries < self.min_carries:
            raise InvalidArgument("max_carries must be >= min_carries", field="max_carries")
        if self.min_carries > self.digits:
            raise InvalidArgument(f"min_carries must be <= digits ({self.digits})", field="min_carries")
        if self.max_value is not None and not 0 <= self.max_value < 10**self.digits:
            raise InvalidArgument(f"max_value must be in [0, {10**self.digits - 1}]", field="max_value")

    @property
    def top(self) -> int:
        return 10**self.digits - 1 if self.max_value is None else self.max_value

    @property
    def answer_width(self) -> int:
        """Characters of every answer: the width of the largest possible result."""
        largest = self.top * self.operands if self.op == "+" else self.top
        return len(str(largest))


def count_carries(values: Iterable[int], digits: int) -> int:
    """Digit columns (of `digits`) whose column sum, including the incoming carry, is >= 10."""
    values = list(values)
    carry = carries = 0
    for col in range(digits):
        total = carry + sum(v // 10**col % 10 for v in values)
        carry = total // 10
        carries += carry > 0
    return carries


def make_problem(values: list[int], spec: ArithSpec) -> dict[str, str]:
    """The row for these operand values (subtraction: values must be sorted largest first)."""
    result = sum(values) if spec.op == "+" else values[0] - sum(values[1:])
    question = spec.op.join(str(v).zfill(spec.digits) for v in values) + "="
    answer = str(result).zfill(spec.answer_width)
    return {"question": question, "answer": answer[::-1] if spec.reverse_answer else answer}


def _draw(rng: random.Random, spec: ArithSpec) -> list[int] | None:
    values = [rng.randint(0, spec.top) for _ in range(spec.operands)]
    if spec.op == "-":
        values.sort(reverse=True)
        return values if values[0] >= sum(values[1:]) else None
    carries = count_carries(values, spec.digits)
    if carries < spec.min_carries or (spec.max_carries is not None and carries > spec.max_carries):
        return None
    return values


def generate(spec: ArithSpec, n: int, seed: int, *, exclude: set[str] | None = None) -> list[dict[str, str]]:
    """`n` distinct problems drawn with `random.Random(seed)`; questions in `exclude` are skipped.

    Raises InvalidArgument when the settings cannot yield `n` distinct problems (after 200·n draws).
    """
    rng = random.Random(seed)
    seen = set(exclude or ())
    rows: list[dict[str, str]] = []
    for _ in range(200 * n + 1000):
        if len(rows) == n:
            break
        values = _draw(rng, spec)
        if values is None:
            continue
        row = make_problem(values, spec)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    if len(rows) < n:
        raise InvalidArgument(f"only {len(rows)} distinct problems for n={n} with {spec}", field="n")
    return rows


def iter_problems(spec: ArithSpec, seed: int) -> Iterator[dict[str, str]]:
    """An endless stream of problems (repeats allowed), for on-line training."""
    rng = random.Random(seed)
    while True:
        values = _draw(rng, spec)
        if values is not None:
            yield make_problem(values, spec)


def write_jsonl(rows: Iterable[dict[str, str]], path: str | pathlib.Path) -> pathlib.Path:
    """Write rows as JSON lines (a taskset file with `question`/`answer` keys)."""
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return out


def answer_reward(response: str, answer: str, eos_text: str = EOS_TEXT) -> float:
    """1.0 when the response before the first EOS, whitespace removed, is exactly `answer`, else 0.0."""
    return float(plain_answer(response, eos_text) == answer)


def digit_reward(response: str, answer: str, eos_text: str = EOS_TEXT) -> float:
    """Fraction of answer characters right in place (0 when the length differs): a denser reward."""
    got = plain_answer(response, eos_text)
    if len(got) != len(answer):
        return 0.0
    return sum(a == b for a, b in zip(got, answer, strict=True)) / len(answer)


# The CPU demo's split (docs/demo-sizing.md): labels exist only for easy problems (at most one carry);
# the RL taskset and the eval set are hard problems (two or more carries) whose answers only the
# reward function reads.
DEMO_SFT_SPEC = ArithSpec(digits=3, max_carries=1)
DEMO_RL_SPEC = ArithSpec(digits=3, min_carries=2)


def write_demo_tasksets(
    out_dir: str | pathlib.Path,
    *,
    seed: int = 0,
    n_sft: int = 20_000,
    n_rl: int = 10_000,
    n_eval: int = 1_000,
) -> dict[str, pathlib.Path]:
    """Write sft.jsonl (easy, labelled), rl.jsonl and eval.jsonl (hard, disjoint); returns their paths."""
    out = pathlib.Path(out_dir)
    eval_rows = generate(DEMO_RL_SPEC, n_eval, seed=2000 + seed)
    held_out = {r["question"] for r in eval_rows}
    rl_rows = generate(DEMO_RL_SPEC, n_rl, seed=3000 + seed, exclude=held_out)
    sft_rows = generate(DEMO_SFT_SPEC, n_sft, seed=1000 + seed, exclude=held_out)
    return {
        "sft": write_jsonl(sft_rows, out / "sft.jsonl"),
        "rl": write_jsonl(rl_rows, out / "rl.jsonl"),
        "eval": write_jsonl(eval_rows, out / "eval.jsonl"),
    }
