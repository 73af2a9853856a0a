"""`simple_mm_workflow` / `async_simple_mm_workflow`: Trinity-RFT's single-turn multi-modal workflow.

Trinity puts a row's images (`format.image_key` column) and videos (`format.video_key`) into one
user message with the prompt (`build_mm_message`): each `<image>` / `<video>` tag of the prompt is
replaced by the next image / video, in order; images and videos without a tag go first (images,
then videos); more tags than media is an error. The system prompt is Trinity's fixed math prompt
(SYSTEM_PROMPT; format.system_prompt is not used), `format.reply_prefix` becomes a last assistant
message, and each of the n replies is scored by the task's reward fn (default `math_boxed_reward`)
against the response_key column; the reward is the sum of its parts, which are kept as metrics.

The models here cannot take images: the engines (services/explorer/engines/: transformers and
vLLM, as built by services/explorer/build.py) generate from text token ids, ModelWrapper has no
multi-modal chat (Trinity's `chat_mm`, which runs the model's AutoProcessor), and the trainer has no
pixel inputs. So `preflight` reports the workflow as unusable here, and a row that carries images or
videos is refused when the workflow is built unless the model has `chat_mm` (`chat_mm_async`). A row with
neither is sent as a text prompt (the message's text parts joined) through `model.chat`.
"""

from __future__ import annotations

import re
from typing import Any

from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import Task
from services.explorer.workflows.math import SimpleWorkflow

SYSTEM_PROMPT = (
    "You are a helpful assistant that solves MATH problems. You should first thinks about the reasoning "
    "process in mind and then provides the user with the answer. You should present your reasoning "
    "process using the format: <think>\n ...your reasoning process here... </think>\n first. You should "
    "always include your final answer in \\boxed{} as closed-form results."
)
ENGINES_TAKING_IMAGES: tuple[str, ...] = ()
"""Rollout engines of this project that accept images or videos: none yet."""
MISSING_SUPPORT = (
    "the rollout engines here (transformers, vllm) generate from text token ids only, ModelWrapper has no "
    "multi-modal chat (Trinity's chat_mm with the model's AutoProcessor), and the trainer has no pixel inputs"
)
_TAG = re.compile(r"(<image>|<video>)")


def media_list(value: Any) -> list[Any]:
    """A row's images or videos as a list: none, one item, or the column's list."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def build_mm_message(prompt: str, images: list[Any], videos: list[Any]) -> dict[str, Any]:
    """Trinity's user message: tags replaced by media in order, untagged media first (images, then videos)."""
    content: list[dict[str, Any]] = []
    used = {"image": 0, "video": 0}
    media = {"image": images, "video": videos}
    for segment in _TAG.split(prompt):
        if segment in ("<image>", "<video>"):
            kind = segment[1:-1]
            if used[kind] >= len(media[kind]):
                raise InvalidArgument(
                    f"the prompt has more <{kind}> tags than the row has {kind}s ({len(media[kind])})",
                    field=f"format.{kind}_key",
                )
            content.append({"type": kind, kind: media[kind][used[kind]]})
            used[kind] += 1
        elif segment:
            content.append({"type": "text", "text": segment})
    untagged = [{"type": "image", "image": item} for item in images[used["image"] :]]
    untagged += [{"type": "video", "video": item} for item in videos[used["video"] :]]
    return {"role": "user", "content": untagged + content}


class SimpleMMWorkflow(SimpleWorkflow):
    """See the module docstring. Resettable and repeatable, like SimpleWorkflow."""

    default_reward_fn = "math_boxed_reward"
    mm_chat = "chat_mm"
    """The model method a multi-modal run calls; a model without it cannot take images."""

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        problems = super().preflight(workflow_args)
        if not ENGINES_TAKING_IMAGES:
            problems.append(
                f"{cls.__name__} sends a row's images and videos to the rollout model, which cannot take "
                f"them: {MISSING_SUPPORT}; use a text taskset with math_boxed_workflow"
            )
        return problems

    def reset(self, task: Task) -> None:
        super().reset(task)
        fmt = task.format_args
        self.images = media_list(task.raw_task.get(fmt.image_key)) if fmt.image_key else []
        self.videos = media_list(task.raw_task.get(fmt.video_key)) if fmt.video_key else []
        if (self.images or self.videos) and not callable(getattr(self.model, self.mm_chat, None)):
            raise FailedPrecondition(
                f"{type(self).__name__}: task {task.task_id!r} has {len(self.images)} image(s) and "
                f"{len(self.videos)} video(s), but the rollout model cannot take them: {MISSING_SUPPORT}",
                field="explorer.rollout_model",
            )
        self.messages = self.format_messages()

    @property
    def multimodal(self) -> bool:
        return bool(self.images or self.videos)

    def format_messages(self) -> list[dict[str, Any]]:
        message = build_mm_message(str(self.question), self.images, self.videos)
        if not self.multimodal:  # text parts only: a plain string, which every chat template reads
            message = {"role": "user", "content": "".join(part["text"] for part in message["content"])}
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}, message]
        if self.format_args.reply_prefix:
            messages.append({"role": "assistant", "content": self.format_args.reply_prefix})
        return messages

    def score_all(self, exps: list[Experience]) -> list[Experience]:
        for exp in exps:
            parts = self.reward_fn(response=exp.response_text, truth=self.truth)
            exp.reward = float(sum(parts.values()))
            exp.metrics.update(parts)
            exp.info["truth"] = self.truth
        return exps

    def run(self) -> list[Experience]:
        sampling = self.rollout_args.sampling()
        if self.multimodal:
            return self.score_all(self.model.chat_mm(self.messages, **sampling))
        return self.score_all(self.model.chat(self.messages, **sampling))


class AsyncSimpleMMWorkflow(SimpleMMWorkflow):
    """SimpleMMWorkflow on the event loop (a multi-modal model needs `chat_mm_async`)."""

    is_async = True
    mm_chat = "chat_mm_async"

    async def run_async(self) -> list[Experience]:
        sampling = self.rollout_args.sampling()
        if self.multimodal:
            return self.score_all(await self.model.chat_mm_async(self.messages, **sampling))
        return self.score_all(await self.model.chat_async(self.messages, **sampling))
