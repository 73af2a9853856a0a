r"""On-policy distillation: the student samples, the teacher (first auxiliary model) scores every token.

Trinity-RFT's on_policy_distill_workflow / on_policy_distill_math_workflow (after Tinker's on-policy
distillation). For each of the task's n samples the teacher's logprob of every response token, given
the same prompt and the tokens before it, goes into `Experience.teacher_logprobs`; the algorithm's
advantage fn (on_policy_distill: kl_coef * (teacher - student); jsd) turns it into the signal, so
the reward is only reported: 0 for the plain workflow, answer accuracy for the math one.

workflow_args: `temperature` (default 1.0), the temperature of the teacher's distribution.
The teacher must share the student's tokenizer (the same token ids are scored). Metric
`kl_divergence`: sum over the response of student - teacher logprob (a sample estimate of KL).

The math variant asks Qwen2.5-Math's way ("Please reason step by step, and put your final answer
within \boxed{}.", system "You are a helpful assistant.") and scores accuracy as
math_eval_workflow does (Qwen2.5-Math's order, through rewards/answers.py), as Trinity does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import Task, Workflow
from services.explorer.workflows.math_eval import eval_accuracy


class OnPolicyDistillWorkflow(Workflow):
    """Student samples with teacher logprobs; see the module docstring."""

    is_async = True
    can_reset = True
    can_repeat = True

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        if not self.auxiliary_model_wrappers:
            raise InvalidArgument(
                f"{type(self).__name__} needs a teacher: list it first in explorer.auxiliary_models "
                "(same tokenizer as the student)",
                field="explorer.auxiliary_models",
            )
        self.teacher = self.auxiliary_model_wrappers[0]
        self.reset(task)

    def reset(self, task: Task) -> None:
        self.task = task
        self.question = task.task_desc
        self.truth = task.truth
        if self.question is None:
            raise KeyError(
                f"task {task.task_id!r} has no {task.format_args.prompt_key!r} column (format.prompt_key)"
            )
        self.temperature = float(task.workflow_args.get("temperature", 1.0))

    def format_messages(self) -> list[dict[str, str]]:
        args = self.task.format_args
        messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
        messages.append({"role": "user", "content": str(self.question)})
        if args.reply_prefix:
            messages.append({"role": "assistant", "content": args.reply_prefix})
        return messages

    def compute_reward(self, exp: Experience) -> float:
        """The plain workflow has no reward signal: the teacher's logprobs are the signal."""
        return 0.0

    async def _sample(self) -> list[Experience]:
        sampling = self.task.rollout_args.sampling()
        if self.task.format_args.prompt_type == "plaintext":
            prompt = str(self.question) + (self.task.format_args.reply_prefix or "")
            return list(await self.model.generate_async([prompt], **sampling))
        return list(await self.model.chat_async(self.format_messages(), **sampling))

    async def run_async(self) -> list[Experience]:
        exps = await self._sample()
        vocab = len(self.teacher.tokenizer)
        for exp in exps:
            tokens = [int(t) for t in exp.tokens]
            if max(tokens) >= vocab:
                raise InvalidArgument(
                    f"token id {max(tokens)} is outside the teacher's vocabulary of {vocab}; the teacher "
                    "must share the student's tokenizer",
                    field="explorer.auxiliary_models[0].model_path",
                )
            scores = await self.teacher.logprobs_async(tokens, self.temperature)
            teacher = np.asarray(scores[exp.prompt_length - 1 :], dtype=np.float32)
            student = np.asarray(exp.logprobs, dtype=np.float32)
            exp.teacher_logprobs = teacher
            exp.reward = self.compute_reward(exp)
            exp.metrics["kl_divergence"] = float((student - teacher).sum())
        return exps


class OnPolicyDistillMathWorkflow(OnPolicyDistillWorkflow):
    """Qwen2.5-Math prompt; the reward (and metric `accuracy`) is the answer's correctness."""

    def format_messages(self) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": "You are a helpful assistant."},
            {
                "role": "user",
                "content": f"{self.question}\nPlease reason step by step, and put your final answer "
                "within \\boxed{}.",
            },
        ]

    def compute_reward(self, exp: Experience) -> float:
        accuracy = 0.0 if self.truth is None else eval_accuracy(exp.response_text, str(self.truth))
        exp.metrics["accuracy"] = accuracy
        return accuracy
