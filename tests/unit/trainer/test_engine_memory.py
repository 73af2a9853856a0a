"""The engine's memory knobs change no number: chunked logprobs (trainer.logprob_chunk_size) and
gradient checkpointing give today's losses and gradients; each phase's peak memory is in the metrics."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.config.algorithm import AlgorithmConfig
from services.common.monitor import peak_rss_mb
from services.trainer.algorithms import build_algorithm
from services.trainer.batching import Batch, build_batch
from services.trainer.engine import TrainEngine
from services.trainer.modeling import ValueModel
from services.trainer.settings import EngineSettings
from tests.fakes.trainer import experience, tiny_model

LOSS_PARTS = ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/entropy_loss", "actor/kl_loss")


def grpo_batch() -> Batch:
    rows = [("a", 1.0, "3"), ("a", 0.0, "33"), ("b", 1.0, "3;x"), ("b", 0.0, "333")]
    exps = [experience("1+2=", r, task_id=t, reward=w) for t, w, r in rows]
    return build_batch(exps, pad_token_id=0)


def engine_for(algorithm: str, **settings: Any) -> TrainEngine:
    """GRPO with a k2 KL loss and an entropy bonus (every loss part live), or PPO with a critic."""
    cfg = AlgorithmConfig(algorithm_type=algorithm, entropy_loss_fn_args={"entropy_coef": 0.01})
    algo = build_algorithm(cfg)
    assert algo.use_reference and algo.entropy_needs_grad
    critic = ValueModel(tiny_model(seed=3)) if algo.use_critic else None
    base = {"micro_batch_size": 2, "lr": 1e-2, "weight_decay": 0.0, "temperature": 0.7}
    return TrainEngine(
        tiny_model(),
        algo,
        EngineSettings(**{**base, **settings}),
        ref_model=tiny_model(seed=1),
        critic=critic,
    )


def assert_same_step(ours: TrainEngine, reference: TrainEngine) -> None:
    """The same loss parts (to 1e-6) and the same accumulated gradients (to 1e-6 of their size)."""
    m_ours, m_ref = ours.train_step(grpo_batch()), reference.train_step(grpo_batch())
    for key in LOSS_PARTS + (("actor/vf_loss",) if ours.critic is not None else ()):
        assert m_ours[key] == pytest.approx(m_ref[key], abs=1e-6), key
    for a, b in zip(
        ours.trainable_modules_parameters(), reference.trainable_modules_parameters(), strict=True
    ):
        assert a.grad is not None and b.grad is not None
        assert float((a.grad - b.grad).abs().max()) <= 1e-6 * max(float(b.grad.abs().max()), 1.0)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_chunked_logprobs_give_todays_losses_and_gradients(algorithm: str) -> None:
    assert_same_step(
        engine_for(algorithm, logprob_chunk_size=3), engine_for(algorithm, logprob_chunk_size=None)
    )


def test_gradient_checkpointing_is_on_in_the_model_and_changes_no_number() -> None:
    checkpointed = engine_for("ppo", gradient_checkpointing=True)
    plain = engine_for("ppo")
    assert checkpointed.model.transformer.gradient_checkpointing  # HF's flag on the GPT-2 body
    assert checkpointed.critic is not None and checkpointed.critic.backbone.gradient_checkpointing
    assert not plain.model.transformer.gradient_checkpointing
    assert_same_step(checkpointed, plain)


def test_each_phase_reports_its_peak_memory() -> None:
    engine = engine_for("grpo")
    metrics = engine.train_step(grpo_batch())
    phases = {"recompute_logprob", "ref", "forward", "backward", "optimizer"}
    peaks = {k: v for k, v in metrics.items() if k.endswith("_peak_mb")}
    assert set(peaks) == {f"memory/{p}_peak_mb" for p in phases | {"step"}}
    assert peaks["memory/step_peak_mb"] >= max(peaks.values())  # the whole step holds every phase
    # Loose bounds: at least the policy's weights (~0.6M floats) are resident; none above the
    # process's peak since start (which the per-phase resets leave intact).
    assert all(2.0 < v <= peak_rss_mb() + 1.0 for v in peaks.values()), peaks
    assert not any(k.endswith("_peak_mb") for k in engine.peaks.metrics())  # drained each step
