"""Every algorithm preset runs one step through the engine with the models it needs (ref, critic)."""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
import torch

from services.common.config.schema import TrinityConfig
from services.common.experience import Experience
from services.trainer.batching import build_batch
from services.trainer.build import build_engine
from tests.fakes.trainer import experience

# algorithm_type -> a metric only its parts report. One preset per path through the loop: reference
# model (grpo), critic (ppo), chosen/rejected pairs (dpo), expert rows (mix), no old logprobs (sft);
# the other presets differ only inside the algorithm library, which tests them itself.
PRESETS = {
    "grpo": "actor/kl_loss",
    "ppo": "actor/vf_loss",
    "dpo": "actor/dpo_loss",
    "mix": "actor/expert/sft_loss",
    "sft": "actor/sft_loss",
}


def _rows(algorithm: str) -> tuple[list[Experience], list[bool] | None]:
    if algorithm == "dpo":
        pair = dict(tokens=np.array([5, 6, 7]), prompt_length=0, model_version=0)
        return [
            Experience(**pair, chosen=np.array([8, 9]), rejected=np.array([10, 11, 12])) for _ in range(2)
        ], None
    rows = [
        experience("1+1=", a, task_id=f"t{i // 2}", reward=float(a == "2"))
        for i, a in enumerate(["2", "3", "2", "33"])
    ]
    return rows, ([False, False, True, True] if algorithm == "mix" else None)


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_one_step_of_each_preset(algorithm: str, tmp_path: pathlib.Path) -> None:
    cfg = TrinityConfig.model_validate(
        {
            "checkpoint_root_dir": str(tmp_path),
            "algorithm": {"algorithm_type": algorithm, "optimizer": {"lr": 1e-3}},
        }
    )
    built = build_engine(cfg, device="cpu")
    engine = built.engine
    assert (engine.ref_model is not None) == engine.algorithm.use_reference
    assert (engine.critic is not None) == (algorithm == "ppo")
    before = [p.detach().clone() for p in engine.model.parameters()]
    rows, expert = _rows(algorithm)
    metrics = engine.train_step(build_batch(rows, pad_token_id=0, is_expert=expert))
    assert PRESETS[algorithm] in metrics
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, engine.model.parameters(), strict=True))


def test_every_option_changed_still_trains(tmp_path: pathlib.Path) -> None:
    cfg = TrinityConfig.model_validate(
        {
            "checkpoint_root_dir": str(tmp_path),
            "algorithm": {
                "algorithm_type": "grpo",
                "optimizer": {
                    "lr": 1e-3,
                    "lr_warmup_steps_ratio": 0.5,
                    "warmup_style": "cosine",
                    "min_lr_ratio": 0.1,
                    "grad_clip": 0.5,
                },
            },
            "trainer": {
                "total_steps": 3,
                "micro_batch_size": 2,
                "ppo_epochs": 2,
                "gradient_checkpointing": True,
            },
            "buffer": {"explorer_input": {"taskset": {"name": "t", "rollout_args": {"temperature": 0.7}}}},
        }
    )
    engine = build_engine(cfg, device="cpu").engine
    assert engine.settings.warmup_steps == 1 and engine.settings.temperature == 0.7
    assert any(getattr(m, "gradient_checkpointing", False) for m in engine.model.modules())
    rows, _ = _rows("grpo")
    lrs = [engine.train_step(build_batch(rows, pad_token_id=0))["actor/lr"] for _ in range(3)]
    # warm-up 1 step (int(0.5 * 3)), then cosine from 1e-3 towards 1e-4 over the 2 remaining steps
    assert lrs == pytest.approx([1e-3, 1e-3, 1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi / 2))])
    assert engine.optimizer.state[next(iter(engine.model.parameters()))]["step"].item() == 6  # 2 epochs x 3


@pytest.mark.parametrize("spelling", ["ours", "verl"])
def test_the_critic_trains_at_its_own_lr(spelling: str, tmp_path: pathlib.Path) -> None:
    # Adam's first step moves every parameter with a nonzero gradient by about lr (the update is
    # lr * m / sqrt(v) = lr * sign(g)), so the largest move of each model shows its learning rate.
    trainer = (
        {"critic_lr": 1e-2} if spelling == "ours" else {"trainer_config": {"critic": {"optim": {"lr": 1e-2}}}}
    )
    cfg = TrinityConfig.model_validate(
        {
            "checkpoint_root_dir": str(tmp_path),
            "algorithm": {"algorithm_type": "ppo", "optimizer": {"lr": 1e-4, "weight_decay": 0.0}},
            "trainer": trainer,
        }
    )
    engine = build_engine(cfg, device="cpu").engine
    assert engine.critic is not None
    assert [g["lr"] for g in engine.optimizer.param_groups] == [1e-4, 1e-2]
    policy = [p.detach().clone() for p in engine.model.parameters()]
    critic = [p.detach().clone() for p in engine.critic.parameters()]
    rows, _ = _rows("ppo")
    engine.train_step(build_batch(rows, pad_token_id=0))

    def largest_move(before: list[torch.Tensor], module: torch.nn.Module) -> float:
        return max(
            float((a - b.detach()).abs().max()) for a, b in zip(before, module.parameters(), strict=True)
        )

    assert largest_move(policy, engine.model) == pytest.approx(1e-4, rel=0.05)
    assert largest_move(critic, engine.critic) == pytest.approx(1e-2, rel=0.05)


def test_one_lr_keeps_one_param_group(tmp_path: pathlib.Path) -> None:
    cfg = TrinityConfig.model_validate(
        {"checkpoint_root_dir": str(tmp_path), "algorithm": {"algorithm_type": "ppo"}}
    )
    engine = build_engine(cfg, device="cpu").engine
    assert len(engine.optimizer.param_groups) == 1  # checkpoints of earlier runs keep their layout


def test_the_trainer_takes_the_sampling_temperature_the_loader_resolved() -> None:
    from services.common.config import validate_config
    from services.trainer.settings import EngineSettings

    tree = {
        "model": {"temperature": 0.6},
        "buffer": {"explorer_input": {"taskset": {"name": "t", "path": "x"}}},
    }
    assert EngineSettings.from_config(validate_config(tree)).temperature == 0.6  # model's, via the taskset
    tree["buffer"]["explorer_input"]["taskset"]["rollout_args"] = {"temperature": 0.9}
    assert EngineSettings.from_config(validate_config(tree)).temperature == 0.9  # the taskset's own wins


@pytest.mark.parametrize(
    "kl", [{"kl_loss_fn": "none"}, {"kl_loss_fn_args": {"kl_coef": 0.0}}], ids=["no-kl", "kl-coef-0"]
)
def test_no_reference_model_without_a_kl_term_that_counts(kl: dict, tmp_path: pathlib.Path) -> None:
    cfg = TrinityConfig.model_validate(
        {"checkpoint_root_dir": str(tmp_path), "algorithm": {"algorithm_type": "grpo", **kl}}
    )
    engine = build_engine(cfg, device="cpu").engine
    assert engine.ref_model is None
    rows, _ = _rows("grpo")
    metrics = engine.train_step(build_batch(rows, pad_token_id=0))
    assert "memory/ref_peak_mb" not in metrics and "actor/kl_loss" not in metrics
    assert math.isfinite(metrics["actor/pg_loss"])
