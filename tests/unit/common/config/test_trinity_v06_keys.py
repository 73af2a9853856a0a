"""Trinity v0.6's new keys (tests/data/trinity_v06_keys.txt): each has a meaning here, as v0.5.2's do;
the engine keys (extra_engine_args, api_key, base_port, weight_sync_buffer_size, parallel sizes), the
trainer's (critic_warmup, offload, megatron) do what their entry says (the research `cod` section is a schema section: test_cod.py).
The inert ones (accepted at the values that change nothing, refused otherwise) are also checked one by
one by test_trinity_inert.py."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from scripts.trinity_compat_doc import TRINITY_KEYS_FILE, TRINITY_V06_KEYS_FILE, schema_gap, trinity_keys
from services.common.config import validate_config
from services.common.errors import ConfigError


def test_every_trinity_v06_key_has_a_meaning_here() -> None:
    v052, v06 = set(trinity_keys(TRINITY_KEYS_FILE)), set(trinity_keys(TRINITY_V06_KEYS_FILE))
    assert v052 <= v06 and len(v06 - v052) == 49  # v0.6 removed no key and added 49
    gap, total = schema_gap(TRINITY_V06_KEYS_FILE)
    assert total == 597
    assert sorted(gap) == []  # the fully_async keys too (services/synchronizer/plan.py)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("explorer.rollout_model.data_parallel_size", 2, "vLLM data parallelism inside one engine: 1 only"),
        ("explorer.rollout_model.pipeline_parallel_size", 2, "vLLM pipeline parallelism: 1 only"),
        ("explorer.rollout_model.enable_expert_parallel", True, "vLLM expert parallelism for MoE models"),
        ("explorer.rollout_model.enable_multimodal", True, "take text"),
        ("explorer.rollout_model.enable_return_routed_experts", True, "router replay"),
        ("algorithm.enable_router_replay", True, "router replay"),
        ("trainer.param_offload", True, "CPU offload is not implemented"),
        ("trainer.offload_policy", True, "CPU offload is not implemented"),
        ("trainer.megatron.tensor_model_parallel_size", 2, "trainer_strategy megatron"),
    ],
)
def test_values_that_would_change_something_are_refused_naming_the_key(
    key: str, value: Any, message: str
) -> None:
    tree: Any = value
    for part in reversed(key.split(".")):
        tree = {part: tree}
    with pytest.raises(ConfigError, match=message) as info:
        validate_config(tree)
    assert str(info.value).startswith(f"{key} {value!r}: ")
    trinity_defaults = {key.split(".")[0]: {}}  # Trinity's defaults change nothing: accepted, dropped
    validate_config(trinity_defaults)


def test_extra_engine_args_reach_the_vllm_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.explorer import build
    from services.explorer.engines import vllm_engine
    from services.models.loading import load_tokenizer

    seen: dict[str, Any] = {}
    engine_class = vllm_engine.VLLMEngine
    monkeypatch.setattr(vllm_engine, "VLLMEngine", lambda path, settings: seen.setdefault("s", settings))
    cfg = validate_config(
        {
            "explorer": {
                "rollout_model": {"engine_type": "vllm", "extra_engine_args": {"max_num_seqs": 32}},
                "auxiliary_models": [
                    {"model_path": "judge", "extra_engine_args": {"max_num_seqs": 4, "swap_space": 1}}
                ],
            }
        }
    )
    tokenizer = load_tokenizer("builtin:tiny-arith")
    build.build_engine(cfg, tokenizer, 0)
    assert seen.pop("s").extra_engine_args == {"max_num_seqs": 32}
    aux = cfg.explorer.auxiliary_models[0]
    build.build_engine(
        cfg, tokenizer, 1000, model_path="judge", rollout=aux.engine_config(cfg.explorer.rollout_model)
    )
    assert seen.pop("s").extra_engine_args == {"max_num_seqs": 4, "swap_space": 1}

    class FakeVLLM:
        class LLM:
            def __init__(self, **kwargs: Any) -> None:
                seen.update(kwargs)

    engine = object.__new__(engine_class)  # vLLM's LLM() is all that _start calls
    engine.settings, engine.vllm, engine.model_path = (
        vllm_engine.VLLMSettings(extra_engine_args={"max_num_seqs": 32}),
        FakeVLLM,
        "m",
    )
    engine._start(on_gpu=False)
    assert seen["max_num_seqs"] == 32 and seen["tensor_parallel_size"] == 1


@pytest.mark.parametrize(
    ("rollout", "message"),
    [
        (
            {"engine_type": "vllm", "extra_engine_args": {"tensor_parallel_size": 2}},
            "set tensor_parallel_size instead",
        ),
        ({"engine_type": "vllm", "extra_engine_args": {"seed": 1}}, "set seed instead"),
        (
            {"engine_type": "vllm", "extra_engine_args": {"logprobs_mode": "raw_logprobs"}},
            "set by this project",
        ),
        (
            {"engine_type": "transformers", "extra_engine_args": {"max_num_seqs": 2}},
            "transformers takes none",
        ),
    ],
)
def test_extra_engine_args_we_set_ourselves_or_for_no_vllm_are_refused(
    rollout: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config({"explorer": {"rollout_model": rollout}})


def test_extra_engine_args_take_plain_values_only() -> None:
    from services.common.config.explorer import check_extra_engine_args

    check_extra_engine_args({"a": 1, "b": [1, "x", None], "c": {"d": 0.5, "e": True}}, "x")
    with pytest.raises(ValueError, match="x.extra_engine_args.f: set is not a value"):
        check_extra_engine_args({"f": {1, 2}}, "x")


def test_weight_sync_buffer_size_is_the_synchronizers_bucket() -> None:
    cfg = validate_config({"explorer": {"rollout_model": {"weight_sync_buffer_size": 64}}})
    assert cfg.synchronizer.bucket_mb == 64
    same = validate_config(
        {"explorer": {"rollout_model": {"weight_sync_buffer_size": 64}}, "synchronizer": {"bucket_mb": 64}}
    )
    assert same.synchronizer.bucket_mb == 64
    with pytest.raises(
        ConfigError, match="weight_sync_buffer_size \\(64\\) and synchronizer.bucket_mb \\(32\\)"
    ):
        validate_config(
            {
                "explorer": {"rollout_model": {"weight_sync_buffer_size": 64}},
                "synchronizer": {"bucket_mb": 32},
            }
        )
    # an auxiliary model gets no weights: any value changes nothing
    validate_config({"explorer": {"auxiliary_models": [{"model_path": "j", "weight_sync_buffer_size": 1}]}})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_openai_api_listens_on_base_port_and_asks_for_api_key() -> None:
    from services.explorer.build import build_runner
    from services.explorer.engines.base import EnginePool
    from services.explorer.runner import VersionRef
    from services.models.loading import load_tokenizer

    port = _free_port()
    cfg = validate_config(
        {"explorer": {"rollout_model": {"api_key": "sesame", "base_port": port}, "runner_per_model": 2}}
    )
    runner = build_runner(
        cfg, EnginePool([None, None]), load_tokenizer("builtin:tiny-arith"), VersionRef(0), []
    )  # type: ignore[list-item]
    wrappers = [slot.wrapper for slot in runner._all]  # runner_per_model 2 x 2 engines
    assert [w.api_port for w in wrappers] == [port, port + 1, port + 2, port + 3]
    wrapper = wrappers[0]
    try:
        assert wrapper.openai_base_url == f"http://127.0.0.1:{port}/v1"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{wrapper.openai_base_url}/models", timeout=10)
        assert refused.value.code == 401
        request = urllib.request.Request(
            f"{wrapper.openai_base_url}/models", headers={"Authorization": "Bearer sesame"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert json.loads(reply.read())["data"][0]["id"] == cfg.model.model_path
        assert wrapper.get_openai_client().api_key == "sesame"
    finally:
        wrapper.close()


def test_critic_warmup_trains_only_the_critic_first(tmp_path: Path) -> None:
    from services.common.config.schema import TrinityConfig
    from services.trainer.batching import build_batch
    from services.trainer.build import build_engine
    from tests.fakes.trainer import experience

    cfg = TrinityConfig.model_validate(
        {
            "checkpoint_root_dir": str(tmp_path),
            "algorithm": {"algorithm_type": "ppo", "optimizer": {"lr": 1e-3}},
            "trainer": {"critic_warmup": 1},
        }
    )
    engine = build_engine(cfg, device="cpu").engine
    assert engine.critic is not None
    rows = [experience("1+1=", a, task_id=f"t{i}", reward=float(a == "2")) for i, a in enumerate(["2", "3"])]

    def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
        return [p.detach().clone() for p in module.parameters()]

    def moved(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
        return any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))

    policy, critic = snapshot(engine.model), snapshot(engine.critic)
    first = engine.train_step(build_batch(rows, pad_token_id=0))
    assert first["critic/warmup"] == 1.0
    assert not moved(policy, engine.model) and moved(critic, engine.critic)
    second = engine.train_step(build_batch(rows, pad_token_id=0))
    assert second["critic/warmup"] == 0.0 and moved(policy, engine.model)


def test_critic_warmup_without_a_critic_is_refused() -> None:
    validate_config({"trainer": {"critic_warmup": 0}})
    with pytest.raises(ConfigError, match="trainer.critic_warmup 3: algorithm_type 'grpo' has no critic"):
        validate_config({"algorithm": {"algorithm_type": "grpo"}, "trainer": {"critic_warmup": 3}})
