"""`rlcr_reward`: RLCR's five reward parts for math with a stated confidence (Trinity-RFT v0.6).

The reply must end with exactly `<think>…</think><answer>…</answer><analysis>…</analysis>
<confidence>q</confidence>`, only whitespace between the four blocks and after the last. Parts,
each multiplied by its weight (`weights`, all five keys required; Trinity's defaults format 0.5,
accuracy 0.5, brier 0.5, mean_confidence 1e-5, confidence_one_or_zero 1e-5); the reward is their sum:

| part                   | value before the weight                                                    |
| ---------------------- | -------------------------------------------------------------------------- |
| format                 | 1 when the terminal chain holds (below), else 0                            |
| accuracy               | 1 when the format holds and the `<answer>` states the truth, else 0        |
| brier                  | 1 - (accuracy - q)^2 when the format holds, else 0                         |
| mean_confidence        | q of the last `<confidence>…</confidence>` (0 when it is not a number in [0, 1]) |
| confidence_one_or_zero | 1 when that q is < 0.01 or > 0.99, else 0                                  |

The chain holds when every `<think>`, `<answer>`, `<analysis>`, `<confidence>` tag (and closing
tag) of the reply pairs up without nesting, the last eight are the four blocks in that order, and q
is a finite number in [0, 1]. mean_confidence and confidence_one_or_zero read the last confidence
block even when the chain fails (no reserved tag inside it). With no truth, accuracy and brier are
0 (Trinity: a failed check is not evidence that the answer is wrong, so no brier either).

Answers: the `<answer>` block's box or `$…$` (else its whole text), or else its final answer
(answers.final_answer), compared with the truth column's answer (answers.truth_answer) by
answers.same_answer, where Trinity parses both with math_verify. `answer_parser` / `verifier`
(callables or dotted paths, Trinity's arguments): the parser reads both the block and the truth,
the verifier compares the two parsed values; an error in either scores accuracy and brier 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from numbers import Real
from typing import Any

from services.common.errors import InvalidArgument
from services.explorer.rewards.answers import final_answer, latex_answer, same_answer, truth_answer

PARTS = ("format", "accuracy", "brier", "mean_confidence", "confidence_one_or_zero")
DEFAULT_WEIGHTS = {
    "format": 0.5,
    "accuracy": 0.5,
    "brier": 0.5,
    "mean_confidence": 1e-5,
    "confidence_one_or_zero": 1e-5,
}
_TAG = re.compile(r"</?(?:think|answer|analysis|confidence)>")
_CHAIN = ("think", "answer", "analysis", "confidence")


def confidence_value(text: str) -> float | None:
    """A finite number in [0, 1] written alone (whitespace around), else None."""
    try:
        value = float(text.strip())
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def last_confidence(reply: str) -> float | None:
    """q of the last `<confidence>…</confidence>`, read even when the chain fails."""
    start, end = reply.rfind("<confidence>"), reply.rfind("</confidence>")
    if start < 0 or end < 0 or start > end:
        return None
    payload = reply[start + len("<confidence>") : end]
    return None if _TAG.search(payload) else confidence_value(payload)


def terminal_chain(reply: str) -> tuple[str, float] | None:
    """(answer block, q) when the reply ends with the four-block chain (module docstring), else None."""
    tags = list(_TAG.finditer(reply))
    open_name = None
    for tag in tags:
        text = tag.group(0)
        name = text.strip("</>")
        if text.startswith("</"):
            if open_name != name:
                return None
            open_name = None
        elif open_name is not None:
            return None
        else:
            open_name = name
    if open_name is not None or len(tags) < 2 * len(_CHAIN):
        return None
    last = tags[-2 * len(_CHAIN) :]
    expected = [t for name in _CHAIN for t in (f"<{name}>", f"</{name}>")]
    if [t.group(0) for t in last] != expected:
        return None
    gaps = [reply[last[i].end() : last[i + 1].start()] for i in (1, 3, 5)] + [reply[last[-1].end() :]]
    if any(gap.strip() for gap in gaps):
        return None
    q = confidence_value(reply[last[6].end() : last[7].start()])
    return None if q is None else (reply[last[2].end() : last[3].start()], q)


def check_weights(weights: Mapping[str, Any] | None) -> dict[str, float]:
    if weights is None:
        return dict(DEFAULT_WEIGHTS)
    field = "reward_fn_args.weights"
    if not isinstance(weights, Mapping):
        raise InvalidArgument(f"weights must be a mapping of {', '.join(PARTS)}", field=field)
    missing, unknown = sorted(set(PARTS) - set(weights)), sorted(set(weights) - set(PARTS))
    if missing or unknown:
        raise InvalidArgument(
            f"weights must name exactly {', '.join(PARTS)}; missing {missing}, unknown {unknown}", field=field
        )
    for name in PARTS:
        value = weights[name]
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
            raise InvalidArgument(
                f"weight {name!r} must be a finite number, got {value!r}", field=f"{field}.{name}"
            )
    return {name: float(weights[name]) for name in PARTS}


def _callable(spec: Any, name: str) -> Callable[..., Any] | None:
    if spec is None or callable(spec):
        return spec
    if isinstance(spec, str):
        from services.common.registry import import_object

        return import_object(spec)
    raise InvalidArgument(
        f"{name} must be a callable or a dotted path, got {spec!r}", field=f"reward_fn_args.{name}"
    )


def states_truth(block: str, truth: str) -> bool:
    gold = truth_answer(truth)
    return any(
        same_answer(answer, gold) for answer in (latex_answer(block) or block.strip(), final_answer(block))
    )


class RLCRReward:
    """See the module docstring."""

    def __init__(
        self, weights: Mapping[str, Any] | None = None, answer_parser: Any = None, verifier: Any = None
    ) -> None:
        self.weights = check_weights(weights)
        self.answer_parser = _callable(answer_parser, "answer_parser")
        self.verifier = _callable(verifier, "verifier")

    def accuracy(self, block: str, truth: str) -> float:
        if self.answer_parser is None and self.verifier is None:
            return float(states_truth(block, truth))
        parse = self.answer_parser or (lambda text: text)
        verify = self.verifier or (lambda a, b: a == b)
        return float(bool(verify(parse(block), parse(str(truth)))))

    def __call__(self, response: str, truth: str | None = None, **_: Any) -> dict[str, float]:
        q_any = last_confidence(response)
        chain = terminal_chain(response)
        accuracy = brier = 0.0
        if chain is not None and truth is not None:
            block, q = chain
            try:
                accuracy = self.accuracy(block, truth)
                brier = 1.0 - (accuracy - q) ** 2
            except Exception:  # a user parser/verifier failure is no verdict on the answer (Trinity)
                accuracy = brier = 0.0
        raw = {
            "format": float(chain is not None),
            "accuracy": accuracy,
            "brier": brier,
            "mean_confidence": q_any if q_any is not None else 0.0,
            "confidence_one_or_zero": float(q_any is not None and (q_any < 0.01 or q_any > 0.99)),
        }
        return {name: self.weights[name] * value for name, value in raw.items()}
