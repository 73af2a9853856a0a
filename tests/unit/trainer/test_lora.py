"""model.lora_configs: the config, a real LoRA step on builtin:tiny-arith, merged weights, checkpoints, resume."""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import pytest
import torch

from services.common.config.loader import validate_config
from services.common.config.schema import TrinityConfig
from services.common.errors import ConfigError, FailedPrecondition, InvalidArgument, NotFound
from services.models.loading import build_builtin, load_causal_lm
from services.trainer.batching import build_batch
from services.trainer.build import build_engine
from services.trainer.checkpoint import full_checkpoint_root, latest_checkpoint
from services.trainer.lora import ADAPTER_DIR, require_peft
from services.trainer.publish import SynchronizerSink
from tests.fakes.leasing_buffer import FakeBuffer, fixed_rows, run_loop
from tests.fakes.trainer import experience

LORA = {"lora_rank": 4, "lora_alpha": 8}  # scale alpha / r = 2
SCALE = 2.0
LAYER = "transformer.h.0.attn.c_attn"  # a GPT-2 Conv1D: weight [in 128, out 384]


def lora_cfg(root: pathlib.Path, lora: dict[str, Any] | None = LORA, **trainer: Any) -> TrinityConfig:
    """A train-only SFT run on builtin:tiny-arith; lora None: without LoRA."""
    return validate_config(
        {
            "checkpoint_root_dir": str(root),
            "mode": "train",
            "algorithm": {"algorithm_type": "sft", "optimizer": {"lr": 3e-3}},
            "model": {"lora_configs": [lora]} if lora is not None else {},
            "buffer": {"batch_size": 4},
            "trainer": {"micro_batch_size": 2, "save_interval": 2, **trainer},
            "monitor": {"monitor_type": "none"},
        }
    )


def adapter_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}


def batch():
    pairs = [("1+2=", "3"), ("2+2=", "4"), ("3+4=", "7"), ("9+9=", "18")]
    return build_batch([experience(p, r, task_id=f"t{i}") for i, (p, r) in enumerate(pairs)], pad_token_id=0)


# ---- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "trainer", "field", "fragment"),
    [
        (
            {"lora_configs": [{"name": "a"}, {"name": "b"}]},
            {},
            "model.lora_configs",
            "has 2 entries; one LoRA adapter",
        ),
        ({"lora_configs": [{"lora_rnak": 8}]}, {}, "model.lora_configs[0].lora_rnak", "lora_rank"),
        ({"lora_configs": [{"lora_rank": 0}]}, {}, "model.lora_configs[0].lora_rank", "greater than"),
        ({"lora_configs": [{"lora_dtype": "fp8"}]}, {}, "model.lora_configs[0].lora_dtype", "bfloat16"),
        ({"lora_configs": [{"is_dummy": True}]}, {}, "model.lora_configs[0].is_dummy", "internal to Trinity"),
        (
            {"lora_configs": [{"path": "/a", "target_modules": ["c_attn"]}]},
            {},
            "model.lora_configs[0].target_modules",
            "brings its own target modules",
        ),
        (
            {"lora_configs": [{}]},
            {"strategy": "fsdp2"},
            "trainer.strategy",
            "fsdp2 with model.lora_configs is not supported",
        ),
    ],
)
def test_bad_lora_configs_are_rejected_naming_the_key(model, trainer, field, fragment) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config({"model": model, "trainer": trainer})
    assert info.value.field == field
    assert fragment in str(info.value)


def test_lora_config_defaults_are_trinitys() -> None:
    cfg = validate_config({"model": {"lora_configs": [{"name": "lora", "is_dummy": False}]}})
    lora = cfg.model.lora
    assert lora is not None and cfg.model.lora_configs == [lora]
    assert (lora.lora_rank, lora.lora_alpha, lora.lora_dtype) == (32, 32, "auto")
    assert (lora.target_modules, lora.exclude_modules, lora.path, lora.base_model_name) == (
        "all-linear",
        None,
        None,
        None,
    )
    assert validate_config({}).model.lora is None
    assert validate_config({"model": {"lora_configs": []}}).model.lora is None


def test_missing_peft_names_the_package_the_extra_and_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    with pytest.raises(FailedPrecondition) as info:
        require_peft()
    assert "peft" in str(info.value) and "pip install 'trinity-grpc[lora]'" in str(info.value)
    assert info.value.field == "model.lora_configs"


# ---- a real step --------------------------------------------------------------------------------


def test_a_step_trains_only_the_adapter_and_publishes_w_plus_scaled_ba(tmp_path: pathlib.Path) -> None:
    engine = build_engine(lora_cfg(tmp_path), device="cpu").engine
    base = build_builtin("builtin:tiny-arith", seed=42).state_dict()  # model.seed 42: the same weights
    frozen = {n: p.detach().clone() for n, p in engine.model.named_parameters() if ".lora_" not in n}
    before = adapter_weights(engine.model)
    assert all(p.requires_grad == (".lora_" in n) for n, p in engine.model.named_parameters())
    # all-linear on GPT-2: 3 blocks x 4 Conv1D (c_attn, attn c_proj, c_fc, mlp c_proj) x (A, B); not lm_head
    assert len(engine.optimizer.param_groups[0]["params"]) == len(before) == 3 * 4 * 2
    assert torch.equal(engine.full_model_state()[f"{LAYER}.weight"], base[f"{LAYER}.weight"])  # B = 0

    for _ in range(2):
        engine.train_step(batch())

    for name, tensor in engine.model.named_parameters():
        if ".lora_" not in name:
            assert torch.equal(tensor, frozen[name]), name
    after = adapter_weights(engine.model)
    assert all(not torch.equal(after[n], before[n]) for n in after if ".lora_B." in n)

    merged = engine.full_model_state()
    assert list(merged) == list(base)  # the base model's names, nothing of the adapter
    prefix = f"base_model.model.{LAYER}"
    a, b = (
        after[f"{prefix}.lora_A.default.weight"],
        after[f"{prefix}.lora_B.default.weight"],
    )  # [4,128], [384,4]
    by_hand = base[f"{LAYER}.weight"] + SCALE * (b @ a).T  # Conv1D keeps W as [in, out]
    torch.testing.assert_close(merged[f"{LAYER}.weight"], by_hand, rtol=0, atol=1e-6)
    assert not torch.allclose(merged[f"{LAYER}.weight"], base[f"{LAYER}.weight"], atol=1e-5)
    for name in ("transformer.wte.weight", f"{LAYER}.bias", "transformer.h.2.ln_2.weight"):
        assert torch.equal(merged[name], base[name]), name  # not adapted: the base, bit for bit

    # What an explorer loads (a plain GPT-2 with the merged weights) computes the trainer's policy.
    plain = build_builtin("builtin:tiny-arith", seed=42)
    plain.load_state_dict(merged)
    ids = batch().inputs.input_ids
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, engine.model(input_ids=ids).logits)
    # ... and so do the engine's logprobs through the peft wrapper (logits_to_keep passed through).
    torch.testing.assert_close(engine.logprobs_of(engine.model, batch()), engine.logprobs_of(plain, batch()))


def test_with_lora_the_reference_is_the_policy_with_its_adapter_disabled(tmp_path: pathlib.Path) -> None:
    cfg = validate_config(
        {
            "checkpoint_root_dir": str(tmp_path),
            "algorithm": {"algorithm_type": "grpo", "optimizer": {"lr": 3e-2}},  # k2 KL loss: a reference
            "model": {"lora_configs": [LORA]},
        }
    )
    engine = build_engine(cfg, device="cpu").engine
    assert engine.algorithm.use_reference and engine.ref_model is None  # no second copy of the base
    rows = [experience("1+1=", a, task_id=f"t{i // 2}", reward=float(i % 2)) for i, a in enumerate("2323")]
    metrics = engine.train_step(build_batch(rows, pad_token_id=0))
    assert "memory/ref_peak_mb" in metrics
    base = build_builtin("builtin:tiny-arith", seed=42)  # model.seed 42: the base's weights
    torch.testing.assert_close(engine.reference_logprobs(batch()), engine.logprobs_of(base, batch()))
    policy = engine.logprobs_of(engine.model, batch())  # the adapter is back on afterwards: trained
    assert not torch.allclose(policy, engine.logprobs_of(base, batch()), atol=1e-4)


async def test_publication_sends_the_merged_weights_under_base_names(tmp_path: pathlib.Path) -> None:
    engine = build_engine(lora_cfg(tmp_path), device="cpu").engine
    engine.train_step(batch())
    got: dict[str, Any] = {}

    class Publisher:
        colocated = False

        async def publish(self, state_dict, step, *, config=None):
            got.update(state=state_dict, step=step, config=config)

    assert await SynchronizerSink(None, Publisher()).publish_resumed(1, engine)
    expected = engine.full_model_state()
    assert got["step"] == 1 and got["config"]["model_type"] == "gpt2" and list(got["state"]) == list(expected)
    assert all(torch.equal(got["state"][n], expected[n]) for n in expected)


def test_lora_dtype_bfloat16_keeps_the_base_in_float32(tmp_path: pathlib.Path) -> None:
    engine = build_engine(lora_cfg(tmp_path, {**LORA, "lora_dtype": "bfloat16"}), device="cpu").engine
    engine.train_step(batch())
    dtypes = {n: p.dtype for n, p in engine.model.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.bfloat16}
    assert {d for n, d in dtypes.items() if ".lora_" not in n} == {torch.float32}
    assert {t.dtype for t in engine.full_model_state().values()} == {torch.float32}


# ---- checkpoints ----------------------------------------------------------------------------------


async def test_resume_restores_adapter_and_optimizer_the_next_step_is_the_uninterrupted_one(
    tmp_path: pathlib.Path,
) -> None:
    straight = await run_loop(lora_cfg(tmp_path / "a", total_steps=3), FakeBuffer(rows=fixed_rows(3)))

    await run_loop(lora_cfg(tmp_path / "b", total_steps=2), FakeBuffer(rows=fixed_rows(2)))
    step_dir = latest_checkpoint(full_checkpoint_root(lora_cfg(tmp_path / "b").run_dir))
    assert step_dir is not None and step_dir[0] == 2
    saved = step_dir[1]
    adapter_files = {p.name for p in (saved / ADAPTER_DIR).iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= adapter_files
    assert json.loads((saved / ADAPTER_DIR / "adapter_config.json").read_text())["r"] == 4

    resumed = await run_loop(lora_cfg(tmp_path / "b", total_steps=3), FakeBuffer(rows=fixed_rows(1, start=2)))
    assert resumed.engine.step == 3
    # Adam's third update depends on its moments: equal adapters after step 3 need the optimizer restored.
    want, have = adapter_weights(straight.engine.model), adapter_weights(resumed.engine.model)
    assert list(want) == list(have)
    for name in want:
        torch.testing.assert_close(have[name], want[name], rtol=0, atol=1e-7)
    # The checkpoint's model/ is a plain HF model holding the merged weights (a model_path for anyone).
    final = latest_checkpoint(full_checkpoint_root(resumed.cfg.run_dir))
    assert final is not None and final[0] == 3
    reloaded = load_causal_lm(str(final[1] / "model")).state_dict()
    merged = resumed.engine.full_model_state()
    assert all(torch.equal(reloaded[n], merged[n]) for n in merged)


async def test_training_continues_from_an_adapter_path(tmp_path: pathlib.Path) -> None:
    first = await run_loop(lora_cfg(tmp_path / "a", total_steps=1), FakeBuffer(rows=fixed_rows(1)))
    checkpoint = latest_checkpoint(full_checkpoint_root(first.cfg.run_dir))
    assert checkpoint is not None
    adapter = str(checkpoint[1] / ADAPTER_DIR)

    built = build_engine(lora_cfg(tmp_path / "b", {"path": adapter}), device="cpu")
    assert built.state is None  # a fresh run that starts from the adapter, not a resume
    want, have = adapter_weights(first.engine.model), adapter_weights(built.engine.model)
    assert list(want) == list(have) and all(torch.equal(want[n], have[n]) for n in want)
    assert all(p.requires_grad for n, p in built.engine.model.named_parameters() if ".lora_" in n)
    merged = built.engine.full_model_state()
    reloaded = load_causal_lm(str(checkpoint[1] / "model")).state_dict()
    assert all(torch.equal(reloaded[n], merged[n]) for n in merged)
    built.engine.train_step(batch())
    trained = adapter_weights(built.engine.model)
    assert all(not torch.equal(trained[n], want[n]) for n in want)

    with pytest.raises(InvalidArgument, match="lora_rank is 8 but the adapter at .* has 4"):
        build_engine(lora_cfg(tmp_path / "c", {"path": adapter, "lora_rank": 8}), device="cpu")
    with pytest.raises(NotFound, match="holds no peft adapter"):
        build_engine(lora_cfg(tmp_path / "d", {"path": str(tmp_path / "nothing")}), device="cpu")


async def test_a_checkpoint_resumes_only_with_the_lora_setting_it_was_written_with(tmp_path) -> None:
    await run_loop(lora_cfg(tmp_path, total_steps=1), FakeBuffer(rows=fixed_rows(1)))
    plain = lora_cfg(tmp_path, None)
    with pytest.raises(FailedPrecondition, match="trained with model.lora_configs"):
        build_engine(plain, device="cpu")
