"""M2PO (Trinity v0.6's m2po policy loss): the batch-wide second-moment mask and the masked loss,
against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from services.common.config import validate_config
from services.common.errors import InvalidArgument
from services.trainer.algorithms import build_algorithm
from services.trainer.algorithms.policy_loss.m2po import m2po_mask, m2po_policy_loss
from tests.fakes.tensors import close, make_batch, t


def test_the_largest_trust_region_tokens_go_until_m2_is_under_the_threshold() -> None:
    # A > 0 and log r > 0 everywhere: all three tokens are in the trust region.
    # (log r)^2 = 0.01, 0.04, 0.09: M2 = 0.046667 > 0.04. Sorted prefix means 0.01, 0.025, 0.046667:
    # two are <= 0.04, so the 0.3 token is dropped and M2 becomes 0.025.
    mask, m = m2po_mask(t([0.1, 0.2, 0.3]), torch.ones(1, 3), torch.ones(1, 3), 0.04)
    assert close(mask, t([1.0, 1.0, 0.0]))
    assert m["m2_before"] == pytest.approx(0.14 / 3) and m["m2_after"] == pytest.approx(0.025)
    assert m["masked_fraction"] == pytest.approx(1 / 3) and m["trust_region_fraction"] == pytest.approx(1.0)


def test_only_the_quadrants_where_ppo_would_clip_are_constrained() -> None:
    # (A, log r) = (-1, 1), (1, -1): outside the trust region, kept whatever their M2;
    # (1, 1), (-1, -1): inside, M2 = 1 > 0.1 and every prefix mean is 1: both dropped
    mask, m = m2po_mask(t([1.0, -1.0, 1.0, -1.0]), torch.ones(1, 4), t([-1.0, 1.0, 1.0, -1.0]), 0.1)
    assert close(mask, t([1.0, 1.0, 0.0, 0.0]))
    assert m["trust_region_fraction"] == pytest.approx(0.5) and m["m2_after"] == 0.0


def test_the_mask_is_batch_wide_not_per_micro_batch() -> None:
    # (log r)^2 = 0.01, 0.09, 0.05 in one batch: sorted 0.01, 0.05, 0.09, prefix means 0.01, 0.03,
    # 0.05: the 0.09 token alone goes -> [1, 0, 1].
    log_ratio = torch.sqrt(t([0.01, 0.09, 0.05]))
    whole, _ = m2po_mask(log_ratio, torch.ones(1, 3), torch.ones(1, 3), 0.04)
    assert close(whole, t([1.0, 0.0, 1.0]))
    # Split in two, each half drops its own: [0.01, 0.09] -> mean 0.05 -> [1, 0]; [0.05] -> [0]
    halves = [
        m2po_mask(log_ratio[:, s], torch.ones(1, 3)[:, s], torch.ones(1, 3)[:, s], 0.04)[0]
        for s in (slice(0, 2), slice(2, 3))
    ]
    assert close(torch.cat(halves, dim=1), t([1.0, 0.0, 0.0]))


def test_padding_is_never_kept_nor_counted() -> None:
    mask, m = m2po_mask(t([0.3, 5.0]), t([1.0, 0.0]), torch.ones(1, 2), 0.04)
    # only the first token is valid: (0.3)^2 = 0.09 > 0.04, dropped
    assert close(mask, t([0.0, 0.0])) and m["masked_fraction"] == pytest.approx(1.0)


def test_the_loss_keeps_every_valid_token_in_the_denominator() -> None:
    # log r = [0, 1], A = 1, the second token masked by M2PO: losses [-1 * 1, 0] over 2 valid tokens = -0.5
    logprob = torch.tensor([[0.0, 1.0]], requires_grad=True)
    loss, m = m2po_policy_loss(logprob, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), t([1.0, 0.0]))
    assert loss.item() == pytest.approx(-0.5) and m["pg_loss"] == pytest.approx(-0.5)
    loss.backward()
    assert close(logprob.grad, t([-0.5, 0.0]))  # -A ratio M / 2; the masked token gets none
    assert m["ratio/mean"] == pytest.approx((1 + math.e) / 2) and m["ppo_kl"] == pytest.approx(-0.5)


def test_the_clamp_keeps_the_gradient() -> None:
    # log r = 25 clamped to 20 in value (ratio e^20) but the gradient still flows: d/dlogprob = -A e^20
    logprob = torch.tensor([[25.0]], requires_grad=True)
    loss, _ = m2po_policy_loss(
        logprob, torch.zeros(1, 1), torch.ones(1, 1), -torch.ones(1, 1), torch.ones(1, 1)
    )
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert logprob.grad.item() == pytest.approx(math.exp(20.0), rel=1e-5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"m2_threshold": -0.01}, "m2_threshold must be finite and >= 0"),
        ({"m2_threshold": float("nan")}, "m2_threshold"),
        ({"log_ratio_clip": float("inf")}, "log_ratio_clip must be finite and > 0"),
        ({"loss_agg_mode": "seq-mean-token-mean"}, "m2po needs loss_agg_mode token-mean"),
    ],
)
def test_bad_settings_are_refused(args: dict[str, object], message: str) -> None:
    ones = torch.ones(1, 1)
    with pytest.raises(InvalidArgument, match=message):
        m2po_policy_loss(ones, ones, ones, ones, ones, **args)  # type: ignore[arg-type]
    # and already when the algorithm is built (trinity config check's preflight)
    section = {"algorithm_type": "m2po", "policy_loss_fn_args": args}
    with pytest.raises(InvalidArgument, match=message):
        build_algorithm(validate_config({"algorithm": section}).algorithm)


def test_a_non_finite_ratio_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="non-finite"):
        m2po_mask(t([float("nan")]), torch.ones(1, 1), torch.ones(1, 1))


def test_algorithm_prepass_sets_the_mask_the_loss_reads() -> None:
    algo = build_algorithm(validate_config({"algorithm": {"algorithm_type": "m2po"}}).algorithm)
    assert algo.needs_update_prepass and not algo.use_reference and not algo.recompute_old_logprob
    batch = make_batch(1, 3, advantages=torch.ones(1, 3))
    metrics = algo.before_update(batch, t([0.1, 0.2, 0.3]))  # the example of the first test
    assert close(batch.m2po_mask, t([1.0, 1.0, 0.0])) and metrics["m2po/masked_fraction"] == pytest.approx(
        1 / 3
    )
    # the loss over the same tokens: -(e^0.1 + e^0.2) / 3 = -(1.105171 + 1.221403) / 3 = -0.775525
    loss, m = algo.compute_loss(batch, t([0.1, 0.2, 0.3]), None)
    assert loss.item() == pytest.approx(-0.775525, abs=1e-5) and "ratio/mean" in m
