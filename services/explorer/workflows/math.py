"""Single-turn workflows: prompt -> n samples -> reward fn (Trinity's SimpleWorkflow / MathWorkflow).

The prompt is `raw_task[format_args.prompt_key]`; with prompt_type "messages" it is sent through
the chat template (with format_args.system_prompt first), with "plaintext" it is used as is
(plus format_args.reply_prefix) — the tiny arithmetic model of the demo reads `047+385=` and
answers `432<eos>`. The reward is the sum of the reward fn's named parts; the parts are kept as
experience metrics (`accuracy` feeds mean@k / best@k and the pass rate).
"""

from __future__ import annotations

from services.common.experience import Experience
from services.explorer.rewards import REWARD_FUNCTIONS, resolve_reward
from services.explorer.workflows.base import ResettableWorkflow, Task


class SimpleWorkflow(ResettableWorkflow):
    """One prompt, n samples, one reward each. Resettable and repeatable."""

    can_repeat = True
    default_reward_fn = "exact_match_reward"

    def reset(self, task: Task) -> None:
        self.task = task
        self.format_args = task.format_args
        self.rollout_args = task.rollout_args
        self.question = task.task_desc
        self.truth = task.truth
        if self.question is None:
            raise KeyError(
                f"task {task.task_id!r} has no {task.format_args.prompt_key!r} column (format.prompt_key)"
            )
        spec = task.reward_fn or REWARD_FUNCTIONS.get(self.default_reward_fn)
        self.reward_fn = resolve_reward(spec, task.reward_fn_args)

    def format_messages(self) -> list[dict[str, str]]:
        messages = []
        system = (
            self.task.raw_task.get(self.format_args.system_prompt_key or "") or self.format_args.system_prompt
        )
        if system:
            messages.append({"role": "system", "content": str(system)})
        messages.append({"role": "user", "content": str(self.question)})
        return messages

    def plaintext_prompt(self) -> str:
        return str(self.question) + (self.format_args.reply_prefix or "")

    def score(self, exp: Experience) -> None:
        parts = self.reward_fn(response=exp.response_text, truth=self.truth, prompt=self.question)
        exp.reward = float(sum(parts.values()))
        exp.metrics.update(parts)
        exp.info["truth"] = self.truth

    def run(self) -> list[Experience]:
        if self.format_args.prompt_type == "plaintext":
            exps = self.model.generate([self.plaintext_prompt()], **self.rollout_args.sampling())
        else:
            exps = self.model.chat(self.format_messages(), **self.rollout_args.sampling())
        for exp in exps:
            self.score(exp)
        return exps


class AsyncSimpleWorkflow(SimpleWorkflow):
    """SimpleWorkflow on the event loop (no worker thread per rollout)."""

    is_async = True

    async def run_async(self) -> list[Experience]:
        if self.format_args.prompt_type == "plaintext":
            exps = await self.model.generate_async([self.plaintext_prompt()], **self.rollout_args.sampling())
        else:
            exps = await self.model.chat_async(self.format_messages(), **self.rollout_args.sampling())
        for exp in exps:
            self.score(exp)
        return exps


class MathWorkflow(SimpleWorkflow):
    """Math answers: boxed or last number, exact or numeric match."""

    default_reward_fn = "math_reward"


class AsyncMathWorkflow(AsyncSimpleWorkflow):
    default_reward_fn = "math_reward"


class CountdownWorkflow(SimpleWorkflow):
    """Countdown: the truth column holds {"numbers": [...], "target": n}."""

    default_reward_fn = "countdown_reward"


class ArithWorkflow(AsyncSimpleWorkflow):
    """The embedded demo: plaintext "047+385=" -> reward 1 if the text before EOS equals the answer."""

    default_reward_fn = "arith_reward"

    def plaintext_prompt(self) -> str:
        return str(self.question)
