"""What the LLM-judge workflows say to a judge and how they read its reply (Trinity-RFT's prompts).

Two judges, two reply formats:
- RULER (`math_ruler_workflow`, `math_trainable_ruler_workflow`; after OpenPipe ART's RULER): one
  call sees the question and the whole group of candidate answers and ends its reply with a list
  of scores, `[0.8, 0.1, ...]`. `parse_score_list` reads the last `[...]` of the reply.
- Rubric (`rubric_judge_workflow`; RaR-Implicit, arXiv:2507.17746): one call per answer, which
  starts with a fenced JSON block holding `{"rating": 1..10}`. `parse_rubric_rating` reads it.

A reply that cannot be read gives None, never an exception: the workflow then takes Trinity's
fallback (score 0) and records `judge_success` 0. A judge is an OpenAI-compatible client carrying
`model_path` (explorer.auxiliary_models are served that way, services/explorer/build.py).
"""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import Sequence
from typing import Any

from services.common.errors import InvalidArgument

# The policy's system prompt of the RULER workflows when the task names no other (and its reward fn
# is the default math_reward): reasoning in <think>, answer in <answer>.
THINK_ANSWER_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves "
    "it. The assistant first thinks about the reasoning process in the mind and then provides the "
    "user with the answer. The reasoning process and answer are enclosed within <think> </think> and "
    "<answer> </answer> tags, respectively, i.e.,\n<think> reasoning process here </think>\n"
    "<answer> answer here </answer>.\n"
)

_SOLUTION_FORMAT = (
    "Solution format requirement: first thinks about the reasoning process in the mind and then "
    "provides the final answer. The reasoning process and answer are enclosed within <think> </think> "
    "and <answer> </answer> tags, respectively, i.e.,\n<think> reasoning process here </think>\n"
    "<answer> answer here </answer>."
)
_RULER_ASK = (
    "Please assign a score within the range [0, 1] for each of them, reflecting how well they solve "
    "the question.\nYou may compare them against each other and think step by step before returning "
    "your final scores, but keep your reasoning process brief and concise when possible."
)

# The policy's default system prompt in rubric_judge_workflow (Trinity's text, trailing spaces included).
RUBRIC_POLICY_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves "
    "it. The assistant first thinks about the reasoning process in the mind and then provides the "
    "user with the answer.\n    "
)
RUBRIC_JUDGE_SYSTEM_PROMPT = (
    "You are an expert evaluator. Given a user prompt, a generated response, and a list of quality "
    "rubrics, please rate the overall quality of the response on a scale of 1 to 10 based on how well "
    "it satisfies the rubrics.\nConsider all rubrics holistically when determining your score. A "
    "response that violates multiple rubrics should receive a lower score, while a response that "
    "satisfies all rubrics should receive a higher score.\nStart your response with a valid JSON "
    'object that starts with "```json" and ends with "```". The JSON object should contain\na single '
    'key "rating" and the value should be an integer between 1 and 10.\nExample response:\n```json\n'
    '{\n"rating": 7\n}```'
)
NO_RUBRIC = "Rubrics are not provided."


def ruler_messages(question: str, answers: Sequence[str], *, spaced: bool = True) -> list[dict[str, str]]:
    """The RULER judge's conversation about `answers` to `question`.

    `spaced`: blank lines between the parts, as math_ruler_workflow's prompt has; the trainable
    RULER's prompt has single line breaks.
    """
    count = len(answers)
    system = (
        f"You are a fair judge. The user will provide a question and {count} candidate solutions to "
        "it. Your task is to compare the solutions, see how well they resolve the question, and "
        "assign a score within the range [0, 1] for each solution."
    )
    solutions = "\n\n".join(f"Candidate solution {i + 1}: {text}" for i, text in enumerate(answers))
    gap = "\n\n" if spaced else "\n"
    user = (
        "\nBelow is a question and several candidate solutions."
        f"{gap}Question: {question}\n\n{_SOLUTION_FORMAT}"
        f"{gap}{solutions}"
        f"{gap}{_RULER_ASK}"
        f"{gap}Conclude your response with a list of scores, in the following format: [score for "
        f"solution 1, score for solution 2, ..., score for solution {count}]\n"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_score_list(reply: str | None, count: int) -> list[float] | None:
    """The `count` scores of the reply's last `[...]`, each clipped to [0, 1]; None when unreadable.

    Unreadable: no `[...]`, not a Python literal list of numbers, or not exactly `count` of them.
    """
    if not reply:
        return None
    start, end = reply.rfind("["), reply.rfind("]")
    if start == -1 or end == -1 or start > end:
        return None
    try:
        values = ast.literal_eval(reply[start : end + 1])
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(values, list) or len(values) != count:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    return [min(1.0, max(0.0, float(v))) for v in values]


def format_rubric(rubric: Any) -> str:
    """`Rubric i (weight: w): description` lines (i from 0), or NO_RUBRIC for an empty rubric.

    `rubric` is the task's `rubric` column: a list of {"description", "weight"} items, or its JSON text.
    """
    items = json.loads(rubric) if isinstance(rubric, str) else rubric
    if not items:
        return NO_RUBRIC
    if not isinstance(items, list) or not all(
        isinstance(item, dict) and "description" in item and "weight" in item for item in items
    ):
        raise InvalidArgument(
            'the rubric column must be a list of {"description": ..., "weight": ...} items',
            field="raw_task.rubric",
        )
    return "\n".join(
        f"Rubric {i} (weight: {item['weight']}): {item['description']}" for i, item in enumerate(items)
    )


def rubric_messages(question: str, answer: str, rubric_text: str) -> list[dict[str, str]]:
    """The rubric judge's conversation about one answer."""
    user = (
        "Given the following prompt, response, and rubrics, please rate the overall quality of the "
        "response on a scale of 1 to 10 based\non how well it satisfies the rubrics.\n"
        f"<prompt>\n{question}\n</prompt>\n<response>\n{answer}\n</response>\n"
        f"<rubrics>\n{rubric_text}\n</rubrics>\nYour JSON Evaluation:"
    )
    return [
        {"role": "system", "content": RUBRIC_JUDGE_SYSTEM_PROMPT},
        {"role": "user", "content": user},
    ]


def parse_rubric_rating(reply: str | None) -> float | None:
    """The reward `rating / 10` read from the reply's first fenced JSON block; None when unreadable.

    The block opens with "```json" (else the first "```") and closes at the next "```"; its JSON
    object must hold a number `rating` in [1, 10].
    """
    if not reply:
        return None
    tag = "```json"
    start = reply.find(tag)
    if start == -1:
        tag = "```"
        start = reply.find(tag)
    if start == -1:
        return None
    end = reply.find("```", start + len(tag))
    if end == -1:
        return None
    try:
        parsed = json.loads(reply[start + len(tag) : end].strip())
    except (ValueError, RecursionError):
        return None
    rating = parsed.get("rating") if isinstance(parsed, dict) else None
    if not isinstance(rating, (int, float)) or isinstance(rating, bool):
        return None
    if not 1 <= rating <= 10:  # also rejects NaN
        return None
    return float(rating) * 0.1


def first_auxiliary_model(workflow: str, auxiliary_models: Sequence[Any]) -> Any:
    """The judge of `workflow`: explorer.auxiliary_models[0]; a clear error when none is configured."""
    if not auxiliary_models:
        raise InvalidArgument(
            f"{workflow} scores its rollouts with an LLM judge, the first of explorer.auxiliary_models, "
            "and none is configured; add one, e.g. explorer.auxiliary_models: [{model_path: <judge model>}]",
            field="explorer.auxiliary_models",
        )
    return auxiliary_models[0]


def ask_judge(judge: Any, messages: list[dict[str, str]], **sampling: Any) -> str | None:
    """The judge's reply text (None when it has none), through its OpenAI chat-completions API."""
    completion = judge.chat.completions.create(
        model=judge.model_path, messages=messages, stream=False, **sampling
    )
    content = completion.choices[0].message.content
    return None if content is None else str(content)


async def ask_judge_async(judge: Any, messages: list[dict[str, str]], **sampling: Any) -> str | None:
    """ask_judge off the event loop (the auxiliary models' clients are synchronous)."""
    return await asyncio.to_thread(ask_judge, judge, messages, **sampling)
