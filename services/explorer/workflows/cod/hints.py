"""The CoD hint-update episode: previous hints + a solved trajectory -> updated hints.

update_context shows the task's reward and feedback; pde_update_context (the PDE-discovery
environment's) shows the feedback only and repeats the marker format at the end.

One chat call. The reply must end with the hints between two literal marker lines, each once; the updated
context is "Hints: <that text>" ("Hints: no hint available." when the block is missing or empty).
Reward (Trinity's AsyncCoDUpdateContextWorkflow, cod_workflow_args names), with c = hint_penalty_coef
and L the reply's tokens:
    parse failure                         -c
    no length ramp set (len_zero/max)      0
    L < len_min_penalty                   -c
    else                                  -c * clip((L - len_zero_penalty) / (len_max - len_zero), 0, 1)
"""

from __future__ import annotations

from typing import Any

from services.common.experience import Experience
from services.explorer.workflows.cod.episode import between

HINT_START = "--- Start of updated hints ---"
HINT_END = "--- End of updated hints ---"
NO_HINT = "Hints: no hint available."
INITIAL_HINT = "Hints: null"

_SYSTEM = f"""You solve a sequence of different but related tasks in one environment, one after another.
Between tasks you keep a short set of hints that is shown to you when you start the next task.

Right now your job is to rewrite those hints. You are given the hints used so far and the record of
the task just attempted (its trajectory, reward and the environment's feedback). Keep what still
looks right, drop what the new record contradicts, and add what it teaches: facts about the
environment that were hidden at first, and ways of working that proved themselves. Say so when a
hint is uncertain. Write hints that help with other tasks of this environment, not only this one.

Reason briefly first. Then end your reply with the hints, as Markdown bullet points, between these
two lines copied exactly, with nothing after the second:

{HINT_START}
- a hint
{HINT_END}
"""

_EXAMPLE = f"""
For example, a reply could end like this:
Moving before checking the map cost the last attempt, so I keep the checking habit.
{HINT_START}
- Read the whole map before the first move.
- Check each move against the known hazards.
{HINT_END}
"""


def system_prompt(*, hint_example: bool, max_response_tokens_restraint: int | None) -> str:
    text = _SYSTEM + (_EXAMPLE if hint_example else "")
    if max_response_tokens_restraint:
        text += f"\n\nKeep your reply under {max_response_tokens_restraint} tokens."
    return text


_MARKER_REMINDER = f"""

Reminder of the format: after brief reasoning, end with exactly this block:
{HINT_START}
- your short hints that carry over to other tasks
{HINT_END}
Both marker lines are needed, copied exactly (not shortened to "--- Updated hints ---"), and nothing may
follow the second one."""


def user_prompt(
    *, previous: str, trajectory: str, reward: float, feedback: str, impl: str = "update_context"
) -> str:
    """The update's request. pde_update_context (Trinity's PDEUpdateContextWorkflow) leaves the reward
    out, so the hidden-equation score never reaches the hints, and repeats the marker format."""
    shown = "" if impl == "pde_update_context" else f"Reward: {reward:.3f}\n\n"
    text = (
        f"--- Hints so far ---\n\n{previous or '(none yet)'}\n\n"
        f"--- The task just attempted ---\n\n{trajectory}\n\n"
        f"{shown}Environment feedback: {feedback}\n\n"
        "--- Your job ---\n\nRewrite the hints as the system prompt asks."
    )
    return text + _MARKER_REMINDER if impl == "pde_update_context" else text


def extract_hint(reply: str) -> tuple[str, bool]:
    """("Hints: ...", parsed) from a reply with exactly one marker block (episode.between)."""
    body = between(reply, HINT_START, HINT_END)
    if body is None or not body.strip():
        return NO_HINT, False
    return f"Hints: {body.strip()}", True


def hint_reward(parsed: bool, response_tokens: int, args: Any) -> float:
    """The hint update's reward (module docstring); `args` is a CodWorkflowArgs."""
    coef = args.hint_penalty_coef
    if not parsed:
        return -coef
    if args.len_zero_penalty is None or args.len_max_penalty is None:
        return 0.0
    if args.len_min_penalty is not None and response_tokens < args.len_min_penalty:
        return -coef
    ramp = (response_tokens - args.len_zero_penalty) / (args.len_max_penalty - args.len_zero_penalty)
    return -coef * min(1.0, max(0.0, ramp))


async def update_hints(
    model: Any,
    args: Any,
    sampling: dict[str, Any],
    *,
    previous: str,
    trajectory: str,
    reward: float,
    feedback: str,
    impl: str = "update_context",
) -> Experience:
    """Run one hint update; info["hint"] holds the new hints, info["prev_hint"] the old. impl:
    update_context or pde_update_context (user_prompt)."""
    messages = [
        {
            "role": "system",
            "content": system_prompt(
                hint_example=args.hint_example,
                max_response_tokens_restraint=args.max_response_tokens_restraint,
            ),
        },
        {
            "role": "user",
            "content": user_prompt(
                previous=previous, trajectory=trajectory, reward=reward, feedback=feedback, impl=impl
            ),
        },
    ]
    exp = (await model.chat_async(messages, **{**sampling, "n": 1}))[0]
    hint, parsed = extract_hint(exp.response_text)
    exp.reward = hint_reward(parsed, exp.response_length, args)
    exp.metrics["hint_parse_success"] = float(parsed)
    exp.info.update(
        {
            "hint": hint,
            "prev_hint": previous,
            "hint_parse_success": parsed,
            "user_prompt": messages[1]["content"],
        }
    )
    return exp
