"""The training step with algorithm.bypass_old_logprobs and rollout_correction, on a tiny GPT-2."""

from __future__ import annotations

import math
from typing import Any

import pytest

from services.common.config import validate_config
from services.common.errors import InvalidArgument
from services.trainer.algorithms import build_algorithm
from services.trainer.batching import Batch, build_batch
from services.trainer.engine import TrainEngine
from services.trainer.settings import EngineSettings
from tests.fakes.trainer import experience, tiny_model

PAD = 0


def engine(**section: Any) -> TrainEngine:
    section = {"algorithm_type": "grpo", "kl_loss_fn": "none", "entropy_loss_fn": "none", **section}
    algorithm = build_algorithm(validate_config({"algorithm": section}).algorithm)
    return TrainEngine(tiny_model(), algorithm, EngineSettings(micro_batch_size=2, lr=1e-3))


def batch() -> Batch:
    # two groups of two with different rewards, so every row has a nonzero GRPO advantage
    exps = [
        experience("1+2=", "3", task_id="a", reward=1.0, logprobs=True),
        experience("1+2=", "4", task_id="a", reward=0.0, logprobs=True),
        experience("2+2=", "44", task_id="b", reward=1.0, logprobs=True),
        experience("2+2=", "5", task_id="b", reward=0.0),  # an external agent's row: no logprobs
    ]
    return build_batch(exps, pad_token_id=PAD)


def test_bypass_off_recomputes_every_row_and_keeps_the_engines() -> None:
    eng = engine(bypass_old_logprobs=False)
    data = batch()
    expected = eng.logprobs_of(eng.model, data) * data.train.action_mask
    eng.prepare(data)
    train = data.train
    assert train.old_logprob.flatten().tolist() == pytest.approx(expected.flatten().tolist(), abs=1e-6)
    assert train.rollout_logprob is not None
    assert train.rollout_logprob[0, :1].tolist() == [-1.0]  # the engine's (the fake's -1.0)
    # a row without engine logprobs gets the recomputed ones: ratio 1, nothing to correct
    assert train.rollout_logprob[3].tolist() == pytest.approx(expected[3].tolist(), abs=1e-6)


def test_bypass_on_keeps_the_engines_logprobs_as_old() -> None:
    eng = engine()
    data = batch()
    eng.prepare(data)
    assert data.train.rollout_logprob is None and data.train.old_logprob[0, 0].item() == -1.0


def test_decoupled_correction_metrics_are_logged_under_their_own_name() -> None:
    eng = engine(
        bypass_old_logprobs=False,
        rollout_correction={"rollout_is": "token", "rollout_rs": "token_k1", "rollout_rs_threshold": 10.0},
    )
    metrics = eng.train_step(batch())
    # the fake engine logprobs (-1.0) vs the untrained model's (about -4.5): r ~ e^-3.5 = 0.03, out of
    # [0.1, 10] and rejected; the row without engine logprobs has r = 1 and stays
    assert metrics["rollout_corr/rollout_is_min"] < 0.1 and metrics["rollout_corr/rollout_is_max"] == 1.0
    assert 0 < metrics["rollout_corr/rollout_is_mean"] < 1
    assert 0 < metrics["rollout_corr/rollout_rs_masked_fraction"] < 1
    assert metrics["rollout_corr/kl"] > 1  # log pi_rollout - log pi_train
    assert not any(k.startswith("actor/rollout_corr") for k in metrics)


def test_bypass_correction_on_policy_data_has_weights_of_one() -> None:
    eng = engine(
        rollout_correction={"rollout_is": "sequence", "rollout_rs": "token_k1", "rollout_rs_threshold": 1.01}
    )
    data = batch()
    data.train.old_logprob = eng.logprobs_of(eng.model, data) * data.train.action_mask  # on-policy rollouts
    metrics = eng.train_step(data)
    # the first optimizer step's micro-batches all see the weights the rollouts came from
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert abs(metrics["rollout_corr/kl"]) < 1e-5 and math.isfinite(metrics["actor/pg_loss"])


def test_m2po_builds_its_mask_once_per_step_over_the_whole_batch() -> None:
    eng = engine(algorithm_type="m2po")
    data = batch()
    data.train.old_logprob = eng.logprobs_of(eng.model, data) * data.train.action_mask  # on-policy
    metrics = eng.train_step(data)
    # on-policy: log r = 0 everywhere, nothing in the trust region, nothing masked, ratio 1
    assert metrics["actor/m2po/m2_before"] == 0.0 and metrics["actor/m2po/masked_fraction"] == 0.0
    assert metrics["actor/ratio/mean"] == pytest.approx(1.0, abs=1e-5) and "time/prepass" in metrics


def test_m2po_refuses_a_model_with_dropout() -> None:
    model = tiny_model()
    model.transformer.drop.p = 0.1  # type: ignore[union-attr]
    algorithm = build_algorithm(validate_config({"algorithm": {"algorithm_type": "m2po"}}).algorithm)
    with pytest.raises(
        InvalidArgument, match="needs a deterministic model; dropout is active in transformer.drop"
    ):
        TrainEngine(model, algorithm, EngineSettings())
