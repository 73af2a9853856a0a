r"""`boxed_shaped_reward`: the shaped reward that taught SmolLM2-135M to answer in a box.

| reply                                                    | reward |
| -------------------------------------------------------- | ------ |
| the last `\boxed{}` holds the right answer               | 1.0    |
| no box, but the last number written is the right answer  | 0.5    |
| a box holding a wrong (or unreadable) answer             | 0.1    |
| anything else (no box, last number wrong or absent)      | 0.0    |

Why shaped this way: a flat credit for any box, with an example answer in the prompt, was hacked
(the model boxed the example everywhere); this shaping, with no example in the prompt, learned
(benchmarks/README.md, "SmolLM2 task and reward"). An empty `\boxed{}` (the prompt's literal, which
the base model copies) is no box: no 0.1 for it. Replies and truths are read and compared by
answers.py.
The weights are reward_fn_args (`boxed_correct`, `unboxed_correct`, `boxed_wrong`). Registered as
`boxed_shaped_reward` in the REWARD_FUNCTIONS of services/explorer/rewards/__init__.py.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import InvalidArgument
from services.explorer.rewards.answers import last_boxed, last_number, same_answer, truth_answer


def shaped_score(
    response: str,
    truth: str,
    *,
    boxed_correct: float = 1.0,
    unboxed_correct: float = 0.5,
    boxed_wrong: float = 0.1,
) -> float:
    """The table above for one reply."""
    answer = truth_answer(truth)
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed_correct if same_answer(boxed, answer) else boxed_wrong
    return unboxed_correct if same_answer(last_number(response), answer) else 0.0


def boxed_shaped_reward(
    response: str,
    truth: str | None = None,
    *,
    boxed_correct: float = 1.0,
    unboxed_correct: float = 0.5,
    boxed_wrong: float = 0.1,
    **_: Any,
) -> dict[str, float]:
    """Reward function (registry name `boxed_shaped_reward`): {"reward": shaped_score(...)}."""
    if truth is None:
        raise InvalidArgument(
            "boxed_shaped_reward needs the task's answer (the taskset's response_key)", field="truth"
        )
    score = shaped_score(
        response,
        str(truth),
        boxed_correct=float(boxed_correct),
        unboxed_correct=float(unboxed_correct),
        boxed_wrong=float(boxed_wrong),
    )
    return {"reward": score}
