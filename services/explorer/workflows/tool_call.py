"""`tool_call_workflow` / `toolcall_workflow`: Trinity-RFT's ToolCallWorkflow (prompt and reward of NVlabs Tool-N1).

The task row holds `tools` (a JSON list of function definitions, or the list itself), `raw_system`
(the dataset's system text), `conversations` (turns `{"from": ..., "value": ...}` with from
human/user, gpt/assistant, observation/tool or function_call) and `answer` (the JSON list of the
expected calls `[{"name": ..., "arguments": {...}}, ...]`). The system message is `raw_system`
followed by the tool prompt below, which lists each tool as `{"type": "function", "function":
tool}` on its own line and asks for `<think>…</think>` then one `<tool_call>[…]</tool_call>`
holding a JSON list of every call.

Reward (Tool-N1's rule, 1.0 or 0.0): the last `<tool_call>` block must parse as JSON (a single
object counts as a one-call list); the reply must hold exactly one `<think>` and one `</think>`,
the `</think>` before the first `<tool_call>`; every call needs `name` and `arguments`; and the
calls must equal the answer's as a multiset of (name, arguments) — order free, arguments compared
as JSON with sorted keys. Anything else scores 0. The block format is a JSON list per block, not
the one-object-per-block format of the explorer's hermes tool-call parser
(services/explorer/chat_parsers.py), so the reply is parsed here.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.common.logging import get_logger
from services.explorer.workflows.base import Task
from services.explorer.workflows.math import SimpleWorkflow

log = get_logger("explorer.workflows.tool_call")

TOOL_PROMPT = """# Tool

<tools>
{tools}
</tools>

In each action step, you MUST:
1. Think about the reasoning process in the mind and enclosed your reasoning within <think> </think> XML tags.
2. Then, provide a json object with function names and arguments within <tool_call></tool_call> XML tags. i.e., <tool_call>[{{"name": <function-name>, "arguments": <args-json-object>}}, {{"name": <function-name2>, "arguments": <args-json-object2>}}, ...]</tool_call>
3. Make sure both the reasoning and the tool call steps are included together in one single reply.
A complete reply example is: <think>To address the query, I need to send the email to Bob and then buy the banana through walmart. </think> <tool_call> [{{"name": "email", "arguments": {{"receiver": "Bob", "content": "I will bug banana through walmart"}}}}, {{"name": "walmart", "arguments": {{"input": "banana"}}}}]</tool_call>. Please make sure the type of the arguments is correct.
"""

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
_ROLES |= {"observation": "tool", "tool": "tool"}
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _json_field(value: Any, field: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{field} is not valid JSON: {exc}", field=field) from exc


def format_tools(tools: Any) -> str:
    """One `{"type": "function", "function": tool}` JSON line per tool."""
    listed = _json_field(tools, "raw_task.tools")
    return "\n".join(json.dumps({"type": "function", "function": tool}) for tool in listed)


def build_messages(raw_task: dict[str, Any]) -> list[dict[str, str]]:
    """The chat for a task row (see the module docstring); unknown `from` values are skipped."""
    for key in ("tools", "conversations"):
        if key not in raw_task:
            raise InvalidArgument(f"a tool-call task needs the column {key!r}", field=f"raw_task.{key}")
    system = str(raw_task.get("raw_system") or "") + TOOL_PROMPT.format(tools=format_tools(raw_task["tools"]))
    messages = [{"role": "system", "content": system}]
    for turn in _json_field(raw_task["conversations"], "raw_task.conversations"):
        source, value = turn.get("from"), turn.get("value")
        if source == "function_call":
            messages.append({"role": "assistant", "content": json.dumps(value)})
        elif source in _ROLES:
            messages.append({"role": _ROLES[source], "content": value})
    return messages


def extract_calls(text: str) -> Any:
    """The JSON in the last <tool_call> block (a JSON string is decoded once more), or None."""
    blocks = _TOOL_CALL_BLOCK.findall(text)
    if not blocks:
        return None
    try:
        calls = json.loads(blocks[-1].strip())
        if isinstance(calls, str):
            calls = json.loads(calls)
    except json.JSONDecodeError:
        return None
    return [calls] if isinstance(calls, dict) else calls


def _call_multiset(calls: list[dict[str, Any]], with_arguments: bool) -> Counter[Any]:
    if with_arguments:
        return Counter((c["name"], json.dumps(c["arguments"], sort_keys=True)) for c in calls)
    return Counter(c["name"] for c in calls)


def match_level(calls: list[dict[str, Any]], answer: list[dict[str, Any]]) -> int:
    """2: same calls with the same arguments; 1: same function names only; 0: otherwise."""
    if not calls or not answer:
        return 2 if len(calls) == len(answer) else 0
    try:
        if _call_multiset(calls, True) == _call_multiset(answer, True):
            return 2
        return 1 if _call_multiset(calls, False) == _call_multiset(answer, False) else 0
    except (KeyError, TypeError):  # unhashable names, arguments that are not JSON, calls without a name
        return 0


def well_formed(calls: Any) -> bool:
    return isinstance(calls, list) and all(
        isinstance(c, dict) and "name" in c and "arguments" in c for c in calls
    )


def toolcall_reward(response: str, answer: Any) -> float:
    """Tool-N1's score of one reply against the expected calls (see the module docstring)."""
    expected = _json_field(answer, "raw_task.answer")
    if isinstance(expected, str):  # answers stored as JSON inside a JSON string
        expected = _json_field(expected, "raw_task.answer")
    if isinstance(expected, dict):
        expected = [expected]
    calls = extract_calls(response)
    if calls is None or response.count("<think>") != 1 or response.count("</think>") != 1:
        return 0.0
    tool_start = response.find("<tool_call>")
    if tool_start != -1 and response.find("</think>") > tool_start:
        return 0.0
    if not well_formed(calls):
        return 0.0
    return 1.0 if match_level(calls, expected) == 2 else 0.0


class ToolCallWorkflow(SimpleWorkflow):
    """See the module docstring. n samples of one prompt, each scored; resettable and repeatable."""

    def reset(self, task: Task) -> None:
        self.task = task
        self.format_args = task.format_args
        self.rollout_args = task.rollout_args
        self.raw_task = task.raw_task
        self.truth = None if task.raw_task.get("answer") is None else str(task.raw_task["answer"])
        self.messages = build_messages(task.raw_task)

    def format_messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.messages]

    def score(self, exp: Experience) -> None:
        answer = self.raw_task.get("answer")
        if answer is None:
            log.warning("tool_call_task_without_answer", task_id=self.task.task_id)
            reward = 0.0
        else:
            reward = toolcall_reward(exp.response_text, answer)
        exp.reward = reward
        exp.metrics["accuracy"] = reward
        exp.info["truth"] = self.truth

    def run(self) -> list[Experience]:
        exps = self.model.chat(self.format_messages(), **self.rollout_args.sampling())
        for exp in exps:
            self.score(exp)
        return exps
