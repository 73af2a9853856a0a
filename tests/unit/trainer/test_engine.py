"""The training step on a tiny GPT-2: logprobs, accumulation, schedule, recomputation, learning."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer.batching import build_batch
from services.trainer.engine import TrainEngine
from services.trainer.logprobs import token_logprobs
from services.trainer.settings import EngineSettings, lr_factor
from tests.fakes.trainer import NllAlgorithm, RowShareNllAlgorithm, experience, tiny_model

PAD = 0


def _batch(n: int = 4, equal: bool = False):
    exps = [experience("1+2=", "3" if equal else "3" * (1 + i % 3), task_id=f"t{i}") for i in range(n)]
    return build_batch(exps, pad_token_id=PAD)


def test_padded_logprobs_equal_unpadded_forward() -> None:
    model = tiny_model()
    engine = TrainEngine(model, NllAlgorithm(), EngineSettings(micro_batch_size=8))
    batch = build_batch([experience("12+7=", "19"), experience("3=", "3;x")], pad_token_id=PAD)
    padded = engine.logprobs_of(model, batch)
    # Row 1 alone, no padding at all: log p(response token t | prefix) from a plain forward.
    ids = batch.inputs.input_ids[1, 3:].unsqueeze(0)  # drop the 3 left-pad columns
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
    direct = logp[0, 1:4].gather(-1, ids[0, 2:5].unsqueeze(-1)).squeeze(-1)
    assert padded[1].tolist() == pytest.approx(direct.tolist(), abs=1e-5)


def test_gradient_accumulation_matches_one_big_micro_batch() -> None:
    # Equal-length rows, so a row-weighted mean of per-micro-batch token means is the full token mean.
    settings = dict(lr=1e-2, grad_clip=0.0, weight_decay=0.0)
    big = TrainEngine(tiny_model(), NllAlgorithm(), EngineSettings(micro_batch_size=4, **settings))
    small = TrainEngine(tiny_model(), NllAlgorithm(), EngineSettings(micro_batch_size=1, **settings))
    m_big = big.train_step(_batch(equal=True))
    m_small = small.train_step(_batch(equal=True))
    assert m_small["actor/loss"] == pytest.approx(m_big["actor/loss"], rel=1e-5)
    # Compare the accumulated gradients (left in .grad after the step): AdamW's first update is
    # ~lr * sign(grad), which would amplify float noise on near-zero gradients.
    for a, b in zip(big.model.parameters(), small.model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7)


def test_micro_batches_of_unequal_lengths_give_the_one_big_micro_batchs_gradient() -> None:
    # Responses of 1, 2, 3 and 1 tokens: each micro-batch's token mean is scaled by its share of the
    # batch's 7 tokens, so one row per micro-batch sums to the full token mean.
    settings = dict(lr=1e-2, grad_clip=0.0, weight_decay=0.0)
    big = TrainEngine(tiny_model(), NllAlgorithm(), EngineSettings(micro_batch_size=4, **settings))
    small = TrainEngine(tiny_model(), NllAlgorithm(), EngineSettings(micro_batch_size=1, **settings))
    rows = TrainEngine(tiny_model(), RowShareNllAlgorithm(), EngineSettings(micro_batch_size=1, **settings))
    m_big, m_small, m_rows = (e.train_step(_batch()) for e in (big, small, rows))
    assert m_small["actor/loss"] == pytest.approx(m_big["actor/loss"], rel=1e-5)
    for a, b in zip(big.model.parameters(), small.model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)  # float32 sums in another order
    # an Algorithm that takes row shares only still trains: each row's mean weighs 1/4
    assert m_rows["actor/loss"] != pytest.approx(m_big["actor/loss"], rel=1e-3)


def test_loss_decreases_on_a_fixed_batch() -> None:
    engine = TrainEngine(tiny_model(), NllAlgorithm(), EngineSettings(micro_batch_size=2, lr=3e-3))
    losses = [engine.train_step(_batch())["actor/loss"] for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0]
    assert engine.step == 8


def test_missing_behaviour_logprobs_are_recomputed_with_the_current_policy() -> None:
    algo = NllAlgorithm()
    algo.needs_old_logprob = True
    engine = TrainEngine(tiny_model(), algo, EngineSettings())
    batch = build_batch([experience("a", "bc", logprobs=True), experience("a", "bcd")], pad_token_id=PAD)
    expected = engine.logprobs_of(engine.model, batch)
    engine.prepare(batch)
    assert batch.train.old_logprob[0, :2].tolist() == [-1.0, -1.0]  # given by the producer: kept
    assert batch.train.old_logprob[1].tolist() == pytest.approx(expected[1].tolist(), abs=1e-6)


def test_lr_schedule_warmup_then_cosine() -> None:
    s = EngineSettings(warmup_steps=2, warmup_style="cosine", total_steps=6, min_lr_ratio=0.1)
    factors = [lr_factor(step, s) for step in range(7)]
    # warm-up 1/2, 1; then cosine over 4 steps from 1 to 0.1: 1, 0.1+0.9*(1+cos(pi/4))/2, 0.55, ...
    assert factors[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert factors[3] == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2)
    assert factors[4] == pytest.approx(0.55)
    assert factors[6] == pytest.approx(0.1)
    assert lr_factor(100, EngineSettings()) == 1.0


def test_gradients_are_clipped_to_grad_clip_before_the_step() -> None:
    engine = TrainEngine(tiny_model(), NllAlgorithm(), EngineSettings(grad_clip=1e-3))
    metrics = engine.train_step(_batch())
    assert metrics["actor/grad_norm"] > 1e-2  # the pre-clip norm is what is reported
    applied = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in engine.model.parameters()]))
    assert applied.item() == pytest.approx(1e-3, rel=1e-3)  # grads stay in .grad after the step


def test_entropy_without_a_loss_term_is_a_metric_outside_autograd() -> None:
    """Same values either way; only an entropy term in the loss (entropy_coef != 0) needs its graph."""
    from services.common.config.algorithm import AlgorithmConfig
    from services.trainer.algorithms import build_algorithm

    logits = torch.randn(2, 3, 5, requires_grad=True)
    tokens = torch.tensor([[0, 1, 2], [3, 4, 0]])
    _, with_graph = token_logprobs(logits, tokens, True)
    _, metric = token_logprobs(logits, tokens, True, entropy_grad=False)
    assert with_graph is not None and metric is not None
    assert with_graph.requires_grad and not metric.requires_grad
    torch.testing.assert_close(metric, with_graph.detach())
    assert build_algorithm(AlgorithmConfig(algorithm_type="sft")).entropy_needs_grad is False
    assert build_algorithm(AlgorithmConfig(algorithm_type="grpo")).entropy_needs_grad is False  # coef 0
    bonus = AlgorithmConfig(algorithm_type="grpo", entropy_loss_fn_args={"entropy_coef": 0.01})
    assert build_algorithm(bonus).entropy_needs_grad is True


def test_grpo_without_kl_skips_zero_advantage_groups_and_updates_as_if_it_had_not() -> None:
    """Group a: rewards 1, 1 (std 0: advantages 0); group b: 1, 0. With one row per micro-batch each
    row's loss is its own, scaled by 1/4, so leaving group a out changes no gradient; with a KL loss
    (which a zero advantage does not cancel) every row is trained."""
    from services.common.config.algorithm import AlgorithmConfig
    from services.trainer.algorithms import build_algorithm

    def grpo_batch():
        rows = [("a", 1.0, "3"), ("a", 1.0, "33"), ("b", 1.0, "3"), ("b", 0.0, "333")]
        exps = [experience("1+2=", r, task_id=t, reward=w, logprobs=True) for t, w, r in rows]
        return build_batch(exps, pad_token_id=PAD)

    no_kl = build_algorithm(AlgorithmConfig(algorithm_type="grpo", kl_loss_fn="none"))
    assert no_kl.zero_advantage_is_inert
    settings = EngineSettings(micro_batch_size=1, lr=1e-2, grad_clip=0.0, weight_decay=0.0)
    skipping = TrainEngine(tiny_model(), no_kl, settings)
    everything = TrainEngine(
        tiny_model(), build_algorithm(AlgorithmConfig(algorithm_type="grpo", kl_loss_fn="none")), settings
    )
    everything.algorithm.zero_advantage_is_inert = False  # type: ignore[misc]
    m_skip, m_all = skipping.train_step(grpo_batch()), everything.train_step(grpo_batch())
    assert m_skip["batch/skipped_rows"] == 2.0 and m_all["batch/skipped_rows"] == 0.0
    assert m_skip["actor/pg_loss"] == pytest.approx(m_all["actor/pg_loss"], abs=1e-6)
    for a, b in zip(skipping.model.parameters(), everything.model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-8)

    with_kl = build_algorithm(AlgorithmConfig(algorithm_type="grpo"))  # k2 KL loss by default
    assert not with_kl.zero_advantage_is_inert
    entropy_bonus = AlgorithmConfig(
        algorithm_type="grpo", kl_loss_fn="none", entropy_loss_fn_args={"entropy_coef": 0.01}
    )
    assert not build_algorithm(entropy_bonus).zero_advantage_is_inert
    assert not build_algorithm(AlgorithmConfig(algorithm_type="sft")).zero_advantage_is_inert


def test_a_batch_of_only_zero_advantage_groups_makes_no_update() -> None:
    from services.common.config.algorithm import AlgorithmConfig
    from services.trainer.algorithms import build_algorithm

    algorithm = build_algorithm(AlgorithmConfig(algorithm_type="grpo", kl_loss_fn="none"))
    engine = TrainEngine(tiny_model(), algorithm, EngineSettings(micro_batch_size=2, lr=1e-2))
    before = [p.detach().clone() for p in engine.model.parameters()]
    exps = [experience("1+2=", r, task_id="a", reward=0.0, logprobs=True) for r in ("3", "33")]
    metrics = engine.train_step(build_batch(exps, pad_token_id=PAD))
    assert metrics["batch/skipped_rows"] == 2.0 and metrics["actor/loss"] == 0.0 and engine.step == 1
    for a, b in zip(before, engine.model.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)
