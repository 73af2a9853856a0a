"""Trinity v0.6's extra_engine_args reach vLLM's engine: a known argument changes the engine, an
unknown one is refused at start and by `trinity config check` (which reads vllm.EngineArgs here); and
enable_thinking reaches the chat template of prompts the vLLM engine answers."""

from __future__ import annotations

import pathlib

import pytest
import torch

from services.cli.config_check import check_file
from services.common.errors import FailedPrecondition
from services.explorer.engines.base import BatchingEngine, SamplingParams
from services.explorer.engines.vllm_engine import VLLMEngine, VLLMSettings
from services.explorer.model_wrapper import ModelWrapper
from services.models.loading import builtin_tokenizer


def _settings(**extra: object) -> VLLMSettings:
    eos = builtin_tokenizer().eos_token_id
    return VLLMSettings(
        dtype="float32",
        max_model_len=256,
        process_mode="in_process",
        eos_token_ids=(eos,),
        extra_engine_args=extra,
    )


def test_a_known_engine_argument_reaches_vllms_scheduler(
    tiny_llama: tuple[pathlib.Path, torch.nn.Module],
) -> None:
    path, _ = tiny_llama
    engine = VLLMEngine(str(path), _settings(max_num_seqs=3))
    try:
        assert engine.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs == 3
        prompt = builtin_tokenizer()("1+1=")["input_ids"]
        (samples,) = engine.generate_batch([prompt], SamplingParams(n=5, temperature=1.0, max_tokens=4))
        assert len(samples) == 5  # more sequences than max_num_seqs still all come back
        # the chat template's enable_thinking, as the explorer's wrapper renders it for this engine
        template = "{% if not enable_thinking %}/no_think {% endif %}{{ messages[0]['content'] }}"
        wrapper = ModelWrapper(
            BatchingEngine(engine), builtin_tokenizer(), chat_template=template, enable_thinking=False
        )
        (exp,) = wrapper.chat([{"role": "user", "content": "1+1="}], n=1, max_tokens=2)
        assert exp.prompt_text == "/no_think 1+1=" and len(exp.tokens) > exp.prompt_length
        assert builtin_tokenizer().decode(exp.tokens[: exp.prompt_length].tolist()) == "/no_think 1+1="
    finally:
        engine.close()


def test_an_unknown_engine_argument_is_refused_naming_the_key(
    tiny_llama: tuple[pathlib.Path, torch.nn.Module], tmp_path: pathlib.Path
) -> None:
    path, _ = tiny_llama
    with pytest.raises(FailedPrecondition, match="vLLM refused the engine arguments \\['max_num_seqz'\\]"):
        VLLMEngine(str(path), _settings(max_num_seqz=3))
    config = tmp_path / "c.yaml"
    config.write_text(
        f"checkpoint_root_dir: {tmp_path}\nmode: explore\nmodel: {{model_path: {path}}}\n"
        "explorer: {rollout_model: {engine_type: vllm, extra_engine_args: {max_num_seqz: 3, max_num_seqs: 3}}}\n"
    )
    _cfg, report = check_file(str(config), [])
    named = [p for p in report.problems if "extra_engine_args" in p]
    assert len(named) == 1 and named[0].startswith(
        "explorer.rollout_model.extra_engine_args.max_num_seqz: not an engine argument"
    )
