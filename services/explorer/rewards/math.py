r"""Trinity-RFT v0.5.2's math reward fns, under its names and arguments; answers checked mathematically.

| name                | parts returned                     | rule                                                   |
| ------------------- | ---------------------------------- | ------------------------------------------------------ |
| `math_reward`       | `accuracy`, `format_score`         | accuracy 1 when the reply's final answer (inside its last `<answer></answer>` when present: the box, else "the answer is …", else the last number) states the truth, else 0; format_score +0.1 for the `<think>…</think><answer>…</answer>` layout, else -0.1 |
| `accuracy_reward`   | `accuracy`                         | 1 when the reply's LaTeX answer (last `\boxed{}`, else last `$…$`) equals the truth, else 0 (plain-text replies: 0, as Trinity's LaTeX extraction) |
| `math_boxed_reward` | `accuracy`, `format_score`         | accuracy 1 when the last `\boxed{}` states the truth, else 0; format_score `-format_score_coef` when `with_think` and the reply lacks exactly one `<think>` before one `</think>`, else 0 |
| `format_reward`     | `format_score`                     | +0.1 when the reply matches `pattern` (default `<think>\n…\n</think>\n<answer>\n…\n</answer>`), else -0.1 |
| `math_dapo_reward`  | `accuracy`, `format_score`         | DAPO (arXiv 2503.14476, sec. 2.4): +1 correct, -1 wrong; format_score the overlong penalty |

Answers are read and compared by answers.py, the one answer reader (`\frac{1}{2}` = `0.5` = `1/2`;
a truth column is read by its `truth_answer`), where Trinity compares normalised strings
(math_boxed_reward), uses math_verify (math_reward, accuracy_reward) or sympy with eval
(math_dapo_reward); math_reward also reads the last `<answer>` where Trinity reads the first.
Differences from Trinity, on purpose: `format_score_coef: 0` means no penalty (Trinity turns a 0
into 0.1); math_boxed_reward takes `with_think` / `format_score_coef` from reward_fn_args as well as
per call (the math_boxed_workflow passes its workflow_args per call, as Trinity does); when a DAPO
reply has no box, its last `Answer: …` line is read (the form the DAPO example's system prompt asks
for, as in DAPO's reference grader), where Trinity v0.5.2 compares the whole reply.
"""

from __future__ import annotations

import re
from collections.abc import Sized
from typing import Any

from services.common.errors import InvalidArgument
from services.explorer.rewards.answers import (
    answer_line,
    final_answer,
    last_boxed,
    latex_answer,
    same_answer,
    tagged_answer,
    truth_answer,
)

FORMAT_PATTERN = r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$"
# Trinity-RFT's math_reward format: reasoning in <think>, then the answer in <answer>, at the end
MATH_FORMAT = re.compile(r".*?<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL | re.MULTILINE)


def math_reward(response: str, truth: str | None = None, **_: Any) -> dict[str, float]:
    """`math_reward` (Trinity's MathRewardFn): see the table above."""
    answer = final_answer(tagged_answer(response) or response)
    right = same_answer(answer, truth_answer(None if truth is None else str(truth)))
    return {"accuracy": 1.0 if right else 0.0, "format_score": 0.1 if MATH_FORMAT.match(response) else -0.1}


def think_pattern_ok(response: str) -> bool:
    """Exactly one `<think>` and one `</think>`, in that order."""
    if response.count("<think>") != 1 or response.count("</think>") != 1:
        return False
    return response.index("<think>") < response.index("</think>")


def boxed_accuracy(response: str, truth: str | None) -> float:
    r"""1.0 when the reply's last `\boxed{}` states the truth's answer (answers.truth_answer), else 0.0."""
    if truth is None:
        return 0.0
    answer = last_boxed(response)
    return 1.0 if answer is not None and same_answer(answer, truth_answer(truth)) else 0.0


class MathBoxedReward:
    """`math_boxed_reward`: {"accuracy": boxed_accuracy, "format_score": 0 or -format_score_coef}."""

    def __init__(self, *, with_think: bool = False, format_score_coef: float = 0.1) -> None:
        """Defaults for the call's `with_think` / `format_score_coef` (Trinity: 0.1, no think check)."""
        self.with_think = bool(with_think)
        self.format_score_coef = float(format_score_coef)

    def __call__(
        self,
        response: str,
        truth: str | None = None,
        with_think: bool | None = None,
        format_score_coef: float | None = None,
        **_: Any,
    ) -> dict[str, float]:
        think = self.with_think if with_think is None else bool(with_think)
        coef = self.format_score_coef if format_score_coef is None else float(format_score_coef)
        format_score = -coef if think and not think_pattern_ok(response) else 0.0
        return {"accuracy": boxed_accuracy(response, truth), "format_score": format_score}


class AccuracyReward:
    """`accuracy_reward` (Trinity's AccuracyReward, after open-r1): 1.0 when the reply's LaTeX answer
    (answers.latex_answer: plain text has none, as with Trinity's extraction) equals the truth. The
    truth is read the same way, or taken whole when it has no LaTeX (`42`). `answer_parser`: a
    callable or dotted path applied to both reply and truth instead."""

    def __init__(self, answer_parser: Any = None) -> None:
        if isinstance(answer_parser, str):
            from services.common.registry import import_object

            answer_parser = import_object(answer_parser)
        self.answer_parser = answer_parser

    def __call__(self, response: str, truth: str | None = None, **_: Any) -> dict[str, float]:
        if truth is None:
            return {"accuracy": 0.0}
        if self.answer_parser is not None:
            answer, gold = self.answer_parser(response), self.answer_parser(str(truth))
            return {"accuracy": 1.0 if answer is not None and answer == gold else 0.0}
        answer = latex_answer(response)
        gold = latex_answer(str(truth)) or str(truth)
        return {"accuracy": 1.0 if answer is not None and same_answer(answer, gold) else 0.0}


class FormatReward:
    """`format_reward`: +0.1 when the whole reply matches `pattern` (DOTALL, MULTILINE), else -0.1."""

    def __init__(self, pattern: str | None = None) -> None:
        source = pattern or FORMAT_PATTERN
        try:
            self.pattern = re.compile(source, re.DOTALL | re.MULTILINE)
        except re.error as exc:
            raise InvalidArgument(f"format_reward pattern {source!r}: {exc}", field="pattern") from exc

    def __call__(self, response: str, **_: Any) -> dict[str, float]:
        return {"format_score": 0.1 if self.pattern.match(response) else -0.1}


def dapo_answer(response: str) -> str:
    """The answer DAPO grades: after the last `</think>`, the last box, else the last `Answer:` line, else all."""
    tail = response.split("</think>")[-1]
    return last_boxed(tail) or answer_line(tail) or tail.strip()


def overlong_penalty(
    length: int, *, max_response_length: int, cache_length: int, penalty_factor: float
) -> float:
    """DAPO's soft overlong punishment of a reply `length` tokens long.

    With L_max = max_response_length and L_cache = cache_length: 0 up to L_max - L_cache, then
    falling linearly to -penalty_factor at L_max, and -penalty_factor beyond.
    """
    expected = max_response_length - cache_length
    if length <= expected:
        return 0.0
    if length > max_response_length:
        return -penalty_factor
    return (expected - length) / cache_length * penalty_factor


class MathDAPOReward:
    """`math_dapo_reward`: {"accuracy": +1 / -1, "format_score": overlong penalty or 0}."""

    def __init__(
        self,
        enable_overlong_penalty: bool | None = None,
        penalty_factor: float | None = None,
        max_response_length: int | None = None,
        cache_length: int | None = None,
    ) -> None:
        """The overlong penalty needs all three numbers, with max_response_length > cache_length (tokens)."""
        self.enable_overlong_penalty = bool(enable_overlong_penalty)
        if self.enable_overlong_penalty:
            missing = [
                name
                for name, value in (
                    ("penalty_factor", penalty_factor),
                    ("max_response_length", max_response_length),
                    ("cache_length", cache_length),
                )
                if value is None
            ]
            if missing:
                raise InvalidArgument(
                    f"math_dapo_reward: enable_overlong_penalty needs {', '.join(missing)} in reward_fn_args",
                    field="reward_fn_args",
                )
            assert max_response_length is not None and cache_length is not None
            if not 0 < cache_length < max_response_length:
                raise InvalidArgument(
                    f"math_dapo_reward: need 0 < cache_length ({cache_length}) < max_response_length "
                    f"({max_response_length})",
                    field="reward_fn_args.cache_length",
                )
        self.penalty_factor = float(penalty_factor or 0.0)
        self.max_response_length = int(max_response_length or 0)
        self.cache_length = int(cache_length or 0)

    def __call__(
        self, response: str, truth: str | None = None, response_token: Sized | None = None, **_: Any
    ) -> dict[str, float]:
        correct = truth is not None and same_answer(dapo_answer(response), truth_answer(truth))
        penalty = 0.0
        if self.enable_overlong_penalty:
            if response_token is None:
                raise InvalidArgument(
                    "math_dapo_reward's overlong penalty needs the reply's tokens (response_token); "
                    "use math_boxed_workflow, which passes them",
                    field="reward_fn_args.enable_overlong_penalty",
                )
            penalty = overlong_penalty(
                len(response_token),
                max_response_length=self.max_response_length,
                cache_length=self.cache_length,
                penalty_factor=self.penalty_factor,
            )
        return {"accuracy": 1.0 if correct else -1.0, "format_score": penalty}
