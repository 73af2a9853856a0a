"""What `trinity debug` prints of an experience: a JSON-ready record, and the same as text for a terminal.

The record holds what a workflow author checks: the conversation (or the prompt and response text),
the reward and the metrics the workflow kept (built-in workflows keep the reward fn's named parts
there, so `reward` is their sum), token counts, and the action-mask view: the response cut into
runs of trained (mask 1) and untrained (mask 0) tokens, each decoded, so the environment text a
multi-turn workflow appended shows apart from what the model said. Pure functions: `decode` turns
token ids into text (the tokenizer's, special tokens kept).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Decode = Callable[[list[int]], str]
INFO_CHARS = 200  # an info value longer than this is cut in the text view (the JSON keeps it whole)


def mask_runs(mask: Sequence[bool] | np.ndarray) -> list[tuple[bool, int, int]]:
    """Maximal runs of equal mask values as (trained, start, end), end exclusive; [] for no tokens."""
    runs: list[tuple[bool, int, int]] = []
    start = 0
    values = [bool(v) for v in mask]
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            runs.append((values[start], start, i))
            start = i
    return runs


def _jsonable(value: Any) -> Any:
    """`value` as JSON can hold it: numpy scalars and arrays as numbers and lists, the rest as str."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def experience_record(exp: Any, *, task_index: int, decode: Decode) -> dict[str, Any]:
    """One experience as `trinity debug --json` prints it (see the module docstring)."""
    tokens = [] if exp.tokens is None else [int(t) for t in exp.tokens]
    prompt_ids, response_ids = tokens[: exp.prompt_length], tokens[exp.prompt_length :]
    mask = [True] * len(response_ids) if exp.action_mask is None else [bool(m) for m in exp.action_mask]
    runs = [
        {"trained": trained, "tokens": end - start, "text": decode(response_ids[start:end])}
        for trained, start, end in mask_runs(mask)
    ]
    return {
        "task_index": task_index,
        "task_id": exp.task_id,
        "run_id": exp.run_id,
        "step": exp.step,
        "model_version": exp.model_version,
        "reward": exp.reward,
        "metrics": {k: float(v) for k, v in exp.metrics.items()},
        "info": _jsonable(exp.info),
        "messages": [{"role": m.role, "content": m.content} for m in exp.messages],
        "prompt_text": exp.prompt_text,
        "response_text": exp.response_text,
        "prompt_decoded": decode(prompt_ids),
        "tokens": {"prompt": len(prompt_ids), "response": len(response_ids), "trained": sum(mask)},
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "action_mask": [int(m) for m in mask],
        "logprobs": None if exp.logprobs is None else [float(x) for x in exp.logprobs],
        "mask_runs": runs,
    }


def _quoted(text: str) -> str:
    """Text on one line with its whitespace visible (JSON string syntax, non-ASCII kept)."""
    return json.dumps(text, ensure_ascii=False)


def _number(value: float | None) -> str:
    if value is None:
        return "none"
    return f"{value:g}" if math.isfinite(value) else str(value)


def _cut(text: str, limit: int = INFO_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def render_text(record: dict[str, Any], *, number: int, total: int) -> list[str]:
    """The lines of one record for a terminal: header, conversation, the prompt as the model saw it
    (decoded tokens: the chat template rendered), mask view, reward, metrics, info; a blank line first."""
    counts = record["tokens"]
    lines = [
        "",
        f"=== experience {number}/{total}: task {record['task_index']} (id {record['task_id']}), "
        f"run {record['run_id']}, step {record['step']}, model version {record['model_version']} ===",
    ]
    if record["messages"]:
        lines.append("messages:")
        lines += [f"  [{m['role']}] {_quoted(m['content'])}" for m in record["messages"]]
    lines.append(f"prompt: {counts['prompt']} tokens: {_quoted(record['prompt_decoded'])}")
    lines.append(
        f"response: {counts['response']} tokens, {counts['trained']} trained "
        "(action mask: + trained, - not trained)"
    )
    lines += [f"  {'+' if run['trained'] else '-'} {_quoted(run['text'])}" for run in record["mask_runs"]]
    trained = [lp for lp, m in zip(record["logprobs"] or [], record["action_mask"], strict=False) if m]
    if trained:
        mean = sum(trained) / len(trained)
        lines.append(f"logprobs of the trained tokens: mean {mean:.4f}, min {min(trained):.4f}")
    lines.append(f"reward: {_number(record['reward'])}")
    if record["metrics"]:
        parts = ", ".join(f"{k}={_number(v)}" for k, v in sorted(record["metrics"].items()))
        lines.append(f"metrics (reward parts and workflow metrics): {parts}")
    if record["info"]:
        items = ", ".join(f"{k}={_cut(json.dumps(v, ensure_ascii=False))}" for k, v in record["info"].items())
        lines.append(f"info: {items}")
    return lines


def render_summary(records: list[dict[str, Any]], failures: list[dict[str, Any]]) -> str:
    """The last line of the text output: how many experiences, their mean reward, how many failed."""
    rewards = [r["reward"] for r in records if r["reward"] is not None]
    mean = f", mean reward {sum(rewards) / len(rewards):.4f}" if rewards else ""
    failed = f", {len(failures)} failed (tracebacks on stderr)" if failures else ""
    return f"{len(records)} experiences{mean}{failed}"
