"""The multi-step base of CoD environments (Trinity's AsyncCoDMultiStepWorkflow).

One episode solves one task: step_async(step) is called up to max_step_num times, each step one
chat call on the whole conversation so far and one experience (its `step` set). At the end every
experience gets the episode's reward; the last one carries info["trajectory"] (the conversation
as text, for the next hint update) and info["feedback"] (the environment's verdict).

A pack hands the episode its hints (set_hint: appended to the system prompt), the response
budget to ask for (set_max_response_tokens_restraint) and `pack_state` (set_pack_state), a dict
shared by the episodes of one pack run only, where an environment keeps what persists across a
pack's tasks (grid navigation's cost map); outside a pack it is the episode's own. Taskset workflow_args read here, with
Trinity's names and defaults:
- context_compression_mode (keep_all): what earlier replies keep in the conversation: all,
  remove_think (no <think> blocks) or keep_answer (the <answer> only);
- length_penalty_coef (0), len_zero_penalty, len_full_penalty: a solved episode's reward r > 0
  becomes max(0, r - coef * (mean_i ramp(L_i) + steps / max_step_num)), ramp(L) =
  clip((L - len_zero) / (len_full - len_zero), 0, 1) over the episode's replies of L tokens.
"""

from __future__ import annotations

import re
from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import ResettableWorkflow, Task

COMPRESSION_MODES = ("keep_all", "remove_think", "keep_answer")
_HINT_HEADER = "\n\n## Hints that might help\n"
_LIMIT_HEADER = "\n\n## Response length limit\n"


def between(text: str, start: str, end: str) -> str | None:
    """The text between the one `start` and the one `end` after it; None when either is missing or
    appears twice (Trinity's strict extraction: an ambiguous reply does not parse)."""
    first, last = text.find(start), text.rfind(start)
    close, close_last = text.find(end), text.rfind(end)
    if first < 0 or first != last or close < 0 or close != close_last or first > close:
        return None
    return text[first + len(start) : close]


def answer_of(reply: str) -> str | None:
    """The text of the reply's one <answer>...</answer> block, stripped; None without exactly one."""
    found = between(reply, "<answer>", "</answer>")
    return found.strip() if found is not None else None


def compress(reply: str, mode: str) -> str:
    if mode == "remove_think":
        return re.sub(r"<think>.*?</think>", "", reply, flags=re.DOTALL).strip()
    if mode == "keep_answer":
        answer = answer_of(reply)
        return (
            f"<answer>{answer}</answer>" if answer is not None else "(Failed to parse answer from response)"
        )
    return reply


def length_penalized(
    reward: float, lengths: list[int], steps: int, max_steps: int, args: dict[str, Any]
) -> float:
    """The solved episode's reward after the length penalty (module docstring)."""
    coef = float(args.get("length_penalty_coef", 0.0))
    if coef <= 0.0 or reward <= 0.0 or not lengths:
        return reward
    zero, full = args.get("len_zero_penalty"), args.get("len_full_penalty")
    if zero is None or full is None or not 0 < int(zero) < int(full):
        raise InvalidArgument(
            f"length_penalty_coef {coef} needs 0 < len_zero_penalty < len_full_penalty, got {zero} and {full}",
            field="workflow_args.len_full_penalty",
        )
    ramps = [min(1.0, max(0.0, (n - int(zero)) / (int(full) - int(zero)))) for n in lengths]
    return max(0.0, reward - coef * (sum(ramps) / len(ramps) + steps / max_steps))


class CodEpisodeWorkflow(ResettableWorkflow):
    """Base of the CoD environments; subclasses implement start(), step_async(), feedback() and
    max_step_num (see the module docstring)."""

    is_async = True

    def reset(self, task: Task) -> None:
        self.task = task
        self.hint: str | None = None
        self.max_response_tokens_restraint: int | None = None
        self.memory: list[dict[str, str]] = []
        self.pack_state: dict[str, Any] = {}
        self.final_reward = 0.0
        self.format_error = False
        mode = str(task.workflow_args.get("context_compression_mode", "keep_all"))
        if mode not in COMPRESSION_MODES:
            raise InvalidArgument(
                f"context_compression_mode must be one of {', '.join(COMPRESSION_MODES)}, got {mode!r}",
                field="workflow_args.context_compression_mode",
            )
        self.compression = mode
        self.setup(task)

    def setup(self, task: Task) -> None:
        """Read the task (environment parameters); called by reset. Pack-shared state belongs in start()."""

    def set_hint(self, hint: str | None) -> None:
        self.hint = hint

    def set_pack_state(self, state: dict[str, Any]) -> None:
        self.pack_state = state

    def set_max_response_tokens_restraint(self, tokens: int | None) -> None:
        self.max_response_tokens_restraint = tokens

    @property
    def max_step_num(self) -> int:
        raise NotImplementedError

    def system_prompt(self) -> str:
        raise NotImplementedError

    def start(self) -> None:
        """Reset the environment for a new episode."""

    async def step_async(self, step: int) -> tuple[bool, list[Experience]]:
        """One step: (go on?, the step's experiences)."""
        raise NotImplementedError

    def feedback(self) -> str:
        """The environment's verdict on the episode, for the hint update."""
        raise NotImplementedError

    def compress_memory(self, step: int) -> None:
        """After step `step` (0-based): shorten earlier replies by context_compression_mode. An environment
        may shorten more (its old observations) by extending this."""
        for message in self.memory:
            if message["role"] == "assistant":
                message["content"] = compress(message["content"], self.compression)

    def augmented_system_prompt(self) -> str:
        text = self.system_prompt()
        if self.hint:
            text += (
                f"{_HINT_HEADER}These hints come from earlier, related tasks. They may be wrong or not apply "
                f"here; use them as prior knowledge and trust what you observe.\n\n{self.hint}"
            )
        if self.max_response_tokens_restraint:
            text += f"{_LIMIT_HEADER}Keep each reply, thinking included, under {self.max_response_tokens_restraint} tokens."
        return text

    async def ask(self, user: str) -> Experience:
        """Append the user turn, sample one reply on the whole conversation, append the reply."""
        self.memory.append({"role": "user", "content": user})
        sampling = {k: v for k, v in dict(self.task.rollout_args).items() if k != "logprobs"}
        exp = (await self.model.chat_async(self.memory, **{**sampling, "n": 1}))[0]
        self.memory.append({"role": "assistant", "content": exp.response_text})
        exp.info["user_prompt"] = user
        return exp

    async def run_async(self) -> list[Experience]:
        self.memory = [{"role": "system", "content": self.augmented_system_prompt()}]
        self.final_reward, self.format_error = 0.0, False
        self.start()
        exps: list[Experience] = []
        steps = 0
        for step in range(self.max_step_num):
            steps = step + 1
            go_on, step_exps = await self.step_async(step)
            self.compress_memory(step)
            for exp in step_exps:
                exp.step = step
            exps.extend(step_exps)
            if not go_on:
                break
        reward = length_penalized(
            self.final_reward,
            [e.response_length for e in exps],
            len(exps),
            self.max_step_num,
            self.task.workflow_args,
        )
        for exp in exps:
            exp.reward = reward
        if exps:
            last = exps[-1]
            last.info["feedback"] = self.feedback()
            last.info["trajectory"] = self.trajectory()
            last.metrics["actual_env_steps"] = float(steps)
            last.metrics["format_error_termination"] = float(self.format_error)
        return exps

    def trajectory(self) -> str:
        """The conversation as text: the rules (system prompt without hints or limit), then each
        observation with the reply to it."""
        parts = []
        step = 0
        for i, message in enumerate(self.memory):
            if message["role"] == "system":
                rules = message["content"].split(_HINT_HEADER)[0].split(_LIMIT_HEADER)[0]
                parts.append(f"System:\n{rules}")
            elif message["role"] == "user":
                step += 1
                following = self.memory[i + 1] if i + 1 < len(self.memory) else None
                reply = (
                    following["content"] if following and following["role"] == "assistant" else "(no action)"
                )
                parts.append(f"Step {step}:\nObservation: {message['content']}\nAction: {reply}")
        return "\n\n".join(parts)
