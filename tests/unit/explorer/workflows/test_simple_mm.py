"""simple_mm_workflow / async_simple_mm_workflow: Trinity's multi-modal message, the reward, and the refusal.

The engines here are text-only, so a row with images is refused; the message building is checked
against hand-made expectations and run through a stand-in multi-modal model (`chat_mm`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.common.config.buffer import FormatConfig
from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.base import RolloutArgs
from services.explorer.workflows.simple_mm import (
    MISSING_SUPPORT,
    SYSTEM_PROMPT,
    AsyncSimpleMMWorkflow,
    SimpleMMWorkflow,
    build_mm_message,
    media_list,
)

REPLIES = ["<think>\nhalf\n</think>\n\\boxed{\\frac{1}{2}}", "\\boxed{2}"]


class CannedChat:
    """A text model answering REPLIES; with `multimodal`, it also has Trinity's chat_mm / chat_mm_async."""

    def __init__(self, multimodal: bool = False) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = []
        if multimodal:
            self.chat_mm = self._recorder("chat_mm")
            self.chat_mm_async = self._async_recorder("chat_mm_async")

    def _exps(self) -> list[Experience]:
        return [
            Experience(tokens=np.arange(3 + len(r)), prompt_length=3, model_version=0, response_text=r)
            for r in REPLIES
        ]

    def _recorder(self, name: str):
        def call(messages: list[dict[str, Any]], **kwargs: Any) -> list[Experience]:
            self.calls.append((name, messages, kwargs))
            return self._exps()

        return call

    def _async_recorder(self, name: str):
        sync = self._recorder(name)

        async def call(messages: list[dict[str, Any]], **kwargs: Any) -> list[Experience]:
            return sync(messages, **kwargs)

        return call

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[Experience]:
        return self._recorder("chat")(messages, **kwargs)

    async def chat_async(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[Experience]:
        return self._recorder("chat_async")(messages, **kwargs)


def mm_task(name: str = "simple_mm_workflow", **raw: Any) -> Task:
    # FormatConfig refuses image_key / video_key in a config (text-only project); build it unchecked
    fmt = FormatConfig.model_construct(
        prompt_key="problem", response_key="answer", image_key="images", video_key="videos", reply_prefix=None
    )
    return Task(
        workflow=WORKFLOWS.get(name),
        raw_task={"problem": "What is x?", "answer": "0.5", **raw},
        format_args=fmt,
        rollout_args=RolloutArgs(n=2, temperature=0.7),
        task_id="t7",
    )


def test_tags_take_media_in_order_and_untagged_media_go_first() -> None:
    message = build_mm_message(
        "First <image> then <video> and finally <image>", ["a.png", "b.png", "c.png"], ["v1.mp4", "v2.mp4"]
    )
    assert message == {
        "role": "user",
        "content": [
            {"type": "image", "image": "c.png"},  # no tag left for the third image
            {"type": "video", "video": "v2.mp4"},
            {"type": "text", "text": "First "},
            {"type": "image", "image": "a.png"},
            {"type": "text", "text": " then "},
            {"type": "video", "video": "v1.mp4"},
            {"type": "text", "text": " and finally "},
            {"type": "image", "image": "b.png"},
        ],
    }
    assert build_mm_message("<image>", ["x"], []) == {
        "role": "user",
        "content": [{"type": "image", "image": "x"}],
    }
    with pytest.raises(InvalidArgument, match="more <video> tags than the row has videos"):
        build_mm_message("<video><video>", [], ["only.mp4"])


def test_media_list() -> None:
    assert (
        media_list(None) == [] and media_list("a.png") == ["a.png"] and media_list(("a", "b")) == ["a", "b"]
    )


def test_preflight_and_construction_refuse_images_on_a_text_model() -> None:
    assert SimpleMMWorkflow.preflight({}) == [
        "SimpleMMWorkflow sends a row's images and videos to the rollout model, which cannot take them: "
        f"{MISSING_SUPPORT}; use a text taskset with math_boxed_workflow"
    ]
    assert "transformers, vllm" in MISSING_SUPPORT and "chat_mm" in MISSING_SUPPORT
    with pytest.raises(FailedPrecondition) as info:
        mm_task(images=["a.png"], videos=["v.mp4", "w.mp4"]).to_workflow(CannedChat())
    assert info.value.message == (
        f"SimpleMMWorkflow: task 't7' has 1 image(s) and 2 video(s), but the rollout model cannot take them: "
        f"{MISSING_SUPPORT}"
    )
    # the async workflow needs chat_mm_async, not the sync chat_mm
    model = CannedChat(multimodal=True)
    del model.chat_mm_async
    with pytest.raises(FailedPrecondition):
        mm_task("async_simple_mm_workflow", images="a.png").to_workflow(model)


def test_text_row_is_a_plain_chat_scored_by_math_boxed_reward() -> None:
    model = CannedChat()
    task = mm_task()
    task.format_args = FormatConfig.model_construct(
        prompt_key="problem",
        response_key="answer",
        image_key="images",
        video_key=None,
        reply_prefix="Let me see.",
    )
    exps = task.to_workflow(model).run()
    [(name, messages, kwargs)] = model.calls
    assert name == "chat" and kwargs == {"n": 2, "temperature": 0.7}
    assert messages == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "What is x?"},
        {"role": "assistant", "content": "Let me see."},
    ]
    # 1/2 = 0.5: accuracy 1; 2 != 0.5: 0; math_boxed_reward has no think check by default: format 0
    assert [e.reward for e in exps] == [1.0, 0.0]
    assert [e.metrics for e in exps] == [
        {"accuracy": 1.0, "format_score": 0.0},
        {"accuracy": 0.0, "format_score": 0.0},
    ]
    assert exps[0].info["truth"] == "0.5"


async def test_image_row_goes_to_chat_mm_with_trinitys_message() -> None:
    model = CannedChat(multimodal=True)
    workflow = mm_task(
        "async_simple_mm_workflow", problem="Find x in <image>.", images=["fig.png"]
    ).to_workflow(model)
    assert isinstance(workflow, AsyncSimpleMMWorkflow)
    exps = await workflow.run_async()
    [(name, messages, _)] = model.calls
    assert name == "chat_mm_async"
    assert messages[1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Find x in "},
            {"type": "image", "image": "fig.png"},
            {"type": "text", "text": "."},
        ],
    }
    assert [e.metrics["accuracy"] for e in exps] == [1.0, 0.0]


def test_reset_rebuilds_the_message_for_the_next_row() -> None:
    model = CannedChat(multimodal=True)
    workflow = mm_task(images=["a.png"]).to_workflow(model)
    assert workflow.resettable() and type(workflow).can_repeat
    workflow.reset(mm_task(problem="Plain?"))
    assert workflow.messages[1] == {"role": "user", "content": "Plain?"}
    workflow.run()
    assert model.calls[-1][0] == "chat"


async def test_async_text_row_on_tiny_arith() -> None:
    """A text row through the real model: the builtin chat template joins the messages' contents."""
    from services.explorer.engines.base import BatchingEngine
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.explorer.model_wrapper import ModelWrapper
    from services.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer("builtin:tiny-arith")
    engine = BatchingEngine(
        TransformersEngine(
            load_causal_lm("builtin:tiny-arith"), eos_token_ids=[tok.eos_token_id], pad_token_id=0
        )
    )
    try:
        model = ModelWrapper(engine, tok, max_prompt_tokens=120, max_response_tokens=6)
        task = mm_task("async_simple_mm_workflow", problem="12+30=", answer="42")
        exps = await task.to_workflow(model).run_async()
    finally:
        engine.close()
    assert len(exps) == 2
    rendered = SYSTEM_PROMPT + "12+30="
    for exp in exps:
        assert exp.prompt_text == rendered
        assert (
            tok.decode(exp.tokens[: exp.prompt_length].tolist()) == rendered[-120:]
        )  # truncated from the left
        assert exp.response_length <= 6 and "\\boxed" not in exp.response_text  # 6 tokens cannot hold a box
        assert exp.metrics == {"accuracy": 0.0, "format_score": 0.0} and exp.reward == 0.0
