"""`enable_thinking` (model.*, Trinity v0.6's explorer.rollout_model.* and auxiliary_models[].*, a buffer's
format.*) reaches the chat template wherever a chat is rendered: the policy's prompts in either engine
type, the OpenAI API (where a request's chat_template_kwargs go over it) and the trainer's messages rows.
The tokenizer is the builtin one saved to a directory with a Qwen3-like template that reads the switch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.common.config import validate_config
from services.common.config.schema import TrinityConfig
from services.common.experience import Task
from services.explorer.build import build_auxiliary, build_pool, build_runner
from services.explorer.runner import VersionRef
from services.models.loading import load_tokenizer
from tests.fakes.env_workflows import ScriptedEngine

# Qwen3's templates open an empty think block when enable_thinking is false; this one writes a marker.
TEMPLATE = (
    "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
MESSAGES = [{"role": "user", "content": "1+1="}]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tok")
    tokenizer = load_tokenizer("builtin:tiny-arith")
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return str(path)


def _config(tokenizer_dir: str, **sections: Any) -> TrinityConfig:
    model = {"model_path": "builtin:tiny-arith", "tokenizer_path": tokenizer_dir, **sections.pop("model", {})}
    return validate_config({"model": model, **sections})


def _policy(cfg: TrinityConfig) -> Any:
    tokenizer = load_tokenizer(cfg.model.model_path, cfg.model.tokenizer_path)
    runner = build_runner(cfg, build_pool(cfg, tokenizer), tokenizer, VersionRef(0), [])
    return runner._all[0].wrapper


def test_rollout_model_enable_thinking_false_reaches_the_transformers_engines_prompt(
    tokenizer_dir: str,
) -> None:
    cfg = _config(tokenizer_dir, explorer={"rollout_model": {"enable_thinking": False}})
    assert cfg.model.enable_thinking is None and cfg.explorer.rollout_model.enable_thinking is False
    wrapper = _policy(cfg)
    (exp,) = wrapper.chat(MESSAGES, n=1, max_tokens=2)
    assert exp.prompt_text == "/no_think user: 1+1=\nassistant: "
    prompt = wrapper.tokenizer.decode(exp.tokens[: exp.prompt_length].tolist())
    assert prompt.startswith("/no_think ")  # the engine was given the rendered prompt's tokens
    thinking = _policy(_config(tokenizer_dir, model={"enable_thinking": True}))
    assert thinking.chat(MESSAGES, n=1, max_tokens=2)[0].prompt_text == "user: 1+1=\nassistant: "


def test_the_vllm_engine_and_the_openai_api_get_the_same_prompt(
    tokenizer_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vLLM engine takes token ids, rendered by the wrapper as for any engine (vLLM is stood in for)."""
    from services.explorer.engines import vllm_engine

    engines: list[ScriptedEngine] = []

    def fake_vllm(path: str, settings: Any) -> ScriptedEngine:
        engines.append(ScriptedEngine(load_tokenizer(path, tokenizer_dir), ["2"] * 4))
        return engines[-1]

    monkeypatch.setattr(vllm_engine, "VLLMEngine", fake_vllm)
    cfg = _config(
        tokenizer_dir, model={"enable_thinking": False}, explorer={"rollout_model": {"engine_type": "vllm"}}
    )
    wrapper = _policy(cfg)
    wrapper.chat(MESSAGES)
    client = wrapper.get_openai_client()
    try:
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
        # a request's own chat_template_kwargs (vLLM's extra) go over the config's switch
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=2,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
    finally:
        wrapper.close()
    prompts = [wrapper.tokenizer.decode(p) for p in engines[0].prompts]
    assert prompts == ["/no_think user: 1+1=\nassistant: "] * 2 + ["user: 1+1=\nassistant: "]


def test_auxiliary_models_default_to_model_enable_thinking(tokenizer_dir: str) -> None:
    cfg = _config(
        tokenizer_dir,
        model={"enable_thinking": False},
        explorer={
            "auxiliary_models": [
                {"model_path": "builtin:tiny-arith"},
                {"model_path": "builtin:tiny-arith", "enable_thinking": True},
            ]
        },
    )
    assert [aux.enable_thinking for aux in cfg.explorer.auxiliary_models] == [False, True]
    wrappers, owned = build_auxiliary(cfg)
    try:
        assert [w.template_kwargs for w in wrappers] == [
            {"enable_thinking": False},
            {"enable_thinking": True},
        ]
    finally:
        for part in owned:
            part.close()


def test_the_trainer_renders_dataset_messages_with_enable_thinking(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    from services.trainer.dataset_source import DatasetAwareSource

    def first_row_prompt(fmt: dict[str, Any], **model: Any) -> str:
        buffers = {"sft": {"name": "sft", "storage_type": "file", "path": str(tmp_path), "format": fmt}}
        cfg = _config(tokenizer_dir, model=model, buffer={"trainer_input": {"auxiliary_buffers": buffers}})
        tokenizer = load_tokenizer(cfg.model.model_path, cfg.model.tokenizer_path)
        source = DatasetAwareSource(None, tokenizer, cfg)
        storage = cfg.buffer.trainer_input.auxiliary_buffers["sft"]
        row = {"messages": [*MESSAGES, {"role": "assistant", "content": "2"}]}
        exp = source._experience(Task(raw_task=row), storage.format, "sft", None)
        return str(tokenizer.decode(exp.tokens[: exp.prompt_length].tolist()))

    messages = {"prompt_type": "messages"}
    assert first_row_prompt(messages, enable_thinking=False) == "/no_think user: 1+1=\nassistant: "
    assert first_row_prompt(messages) == "user: 1+1=\nassistant: "
    own = {**messages, "enable_thinking": True}  # the buffer's format goes over model.enable_thinking
    assert first_row_prompt(own, enable_thinking=False) == "user: 1+1=\nassistant: "
    template = {
        **messages,
        "chat_template": "{{ messages[0]['content'] }}",
    }  # and its template over the tokenizer's
    assert first_row_prompt(template, enable_thinking=False) == "1+1="
