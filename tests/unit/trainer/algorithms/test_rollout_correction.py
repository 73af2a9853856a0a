"""Rollout correction's tensor functions against numbers worked out by hand.

log r = logprob_train - logprob_rollout; ln 2 = 0.693147, ln 3 = 1.098612.
"""

from __future__ import annotations

import math

import pytest
import torch

from services.common.config.rollout_correction import Bounds, RolloutCorrectionConfig
from services.trainer.algorithms.rollout_correction import (
    RolloutCorrection,
    importance_weights,
    off_policy_metrics,
    reinforce_is_loss,
    rejection_mask,
)
from tests.fakes.tensors import close, t

LN2, LN3 = math.log(2.0), math.log(3.0)


def test_token_weights_truncated() -> None:
    # raw w = [2, 1, 0.5]; truncated at 1.5 -> [1.5, 1, 0.5]
    w, m = importance_weights(t([LN2, 0.0, -LN2]), torch.ones(1, 3), level="token", upper=1.5)
    assert close(w, t([1.5, 1.0, 0.5]))
    assert m["rollout_is_mean"] == pytest.approx(1.0)  # (1.5 + 1 + 0.5) / 3
    assert (m["rollout_is_max"], m["rollout_is_min"]) == pytest.approx((2.0, 0.5))  # raw
    # above 1.5: the 2; below 1/1.5 = 0.667: the 0.5
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)
    # ESS = mean(w)^2 / mean(w^2) = 1 / ((2.25 + 1 + 0.25) / 3) = 3 / 3.5
    assert m["rollout_is_eff_sample_size"] == pytest.approx(3 / 3.5)


def test_token_weights_masked_icepop() -> None:
    # raw [2, 1, 0.5] kept only inside [0.6, 1.5]: [0, 1, 0]; the padded 4th token stays 0
    mask = t([1.0, 1.0, 1.0, 0.0])
    w, m = importance_weights(t([LN2, 0.0, -LN2, 5.0]), mask, level="token", upper=1.5, lower=0.6)
    assert close(w, t([0.0, 1.0, 0.0, 0.0]))
    assert m["rollout_is_oob_ratio"] == pytest.approx(2 / 3)
    assert m["rollout_is_mean"] == pytest.approx(1 / 3)
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)  # 0.5 < 0.6


def test_sequence_weights_are_the_row_product() -> None:
    # row 0: ln2 + ln2 -> 4, truncated to 2 on both tokens; row 1: 0 (the masked -ln2 does not count) -> 1
    w, m = importance_weights(
        t([LN2, LN2], [0.0, -LN2]), t([1.0, 1.0], [1.0, 0.0]), level="sequence", upper=2.0
    )
    assert close(w, t([2.0, 2.0], [1.0, 0.0]))
    assert m["rollout_is_mean"] == pytest.approx(5 / 3)  # tokens: (2 + 2 + 1) / 3
    assert (m["rollout_is_max"], m["rollout_is_min"]) == pytest.approx((4.0, 1.0))  # raw, per row
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)  # rows: 4 > 2
    assert not w.requires_grad


def test_batch_normalize_token_and_sequence() -> None:
    # token: raw [2, 1, 1] (under 3: not truncated), mean 4/3 -> [1.5, 0.75, 0.75]
    w, m = importance_weights(
        t([LN2, 0.0, 0.0]), torch.ones(1, 3), level="token", upper=3.0, batch_normalize=True
    )
    assert close(w, t([1.5, 0.75, 0.75])) and m["rollout_is_batch_norm_factor"] == pytest.approx(4 / 3)
    # sequence: row weights 2 and 1, mean over rows 1.5 -> 4/3 and 2/3
    w, m = importance_weights(
        t([LN2, 0.0], [0.0, 0.0]),
        t([1.0, 1.0], [1.0, 0.0]),
        level="sequence",
        upper=3.0,
        batch_normalize=True,
    )
    assert close(w, t([4 / 3, 4 / 3], [2 / 3, 0.0])) and m["rollout_is_batch_norm_factor"] == pytest.approx(
        1.5
    )


def test_token_k1_drops_tokens_outside_the_ratio_band() -> None:
    # r = [3, 1, 1/3] against [0.5, 2]: only the middle token stays
    keep, m = rejection_mask(t([LN3, 0.0, -LN3]), torch.ones(1, 3), {"token_k1": Bounds(0.5, 2.0)})
    assert close(keep, t([0.0, 1.0, 0.0]))
    assert m["rollout_rs_masked_fraction"] == pytest.approx(2 / 3)
    assert m["rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 3)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(1.0)  # the one row lost a token
    assert m["rollout_rs_token_k1_mean"] == pytest.approx(0.0)  # -log r: (-ln3 + 0 + ln3) / 3


def test_sequence_k1_bounds_the_row_ratio() -> None:
    log_ratio = t([LN2, LN2], [LN2, -LN2])
    # seq_sum: prod r = 4 (dropped), 1 (kept)
    keep, m = rejection_mask(log_ratio, torch.ones(2, 2), {"seq_sum_k1": Bounds(0.5, 2.0)})
    assert close(keep, t([0.0, 0.0], [1.0, 1.0]))
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    # seq_mean: geometric means 2 and 1, both inside [0.5, 2.5]
    keep, _ = rejection_mask(log_ratio, torch.ones(2, 2), {"seq_mean_k1": Bounds(0.5, 2.5)})
    assert close(keep, torch.ones(2, 2))


def test_k2_k3_bound_the_divergence_from_above() -> None:
    # token_k2 = (log r)^2 / 2: 0.2 -> 0.02 (> 0.01, dropped), 0.1 -> 0.005 (kept)
    keep, _ = rejection_mask(t([0.2, 0.1]), torch.ones(1, 2), {"token_k2": Bounds(None, 0.01)})
    assert close(keep, t([0.0, 1.0]))
    # seq_max_k3, k3 = e^x - 1 - x: row 0 max(k3(0.1), k3(0.5)) = 0.148721 > 0.1, dropped whole;
    # row 1 max(k3(0.1) = 0.005171, k3(-0.1) = 0.004837) kept
    keep, m = rejection_mask(t([0.1, 0.5], [0.1, -0.1]), torch.ones(2, 2), {"seq_max_k3": Bounds(None, 0.1)})
    assert close(keep, t([0.0, 0.0], [1.0, 1.0]))
    assert m["rollout_rs_seq_max_k3_mean"] == pytest.approx((0.148721 * 2 + 0.005171 * 2) / 4, abs=1e-5)


def test_every_option_must_pass() -> None:
    # token_k1 in [0.5, 2]: drops row 0's first token (r = 3), keeps row 1's (r = e^0.6 = 1.822);
    # seq_mean_k1 in [0.5, 1.8]: geometric means sqrt(3) = 1.732 (kept) and 1.822 (row 1 dropped)
    bounds = {"token_k1": Bounds(0.5, 2.0), "seq_mean_k1": Bounds(0.5, 1.8)}
    keep, m = rejection_mask(t([LN3, 0.0], [0.6, 0.6]), torch.ones(2, 2), bounds)
    assert close(keep, t([0.0, 1.0], [0.0, 0.0]))
    assert m["rollout_rs_masked_fraction"] == pytest.approx(3 / 4)


def test_off_policy_metrics_by_hand() -> None:
    # train 0.5, rollout 0.25: r = 2
    m = off_policy_metrics(t([math.log(0.5)]), t([math.log(0.25)]), torch.ones(1, 1))
    assert m["kl"] == pytest.approx(-LN2)  # log pi_rollout - log pi_train
    assert m["k3_kl"] == pytest.approx(2 - LN2 - 1)  # 0.306853
    assert m["chi2_token"] == pytest.approx(3.0) and m["chi2_seq"] == pytest.approx(3.0)  # 2^2 - 1
    assert m["log_ppl_diff"] == pytest.approx(-LN2)


def test_reinforce_is_loss_by_hand() -> None:
    # loss_t = -A w logprob: -(1)(2) ln 0.5 = 1.386294; -(-1)(0.5) ln 0.25 = -0.693147; mean 0.346574
    logprob = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    loss, m = reinforce_is_loss(logprob, t([0.0, 0.0]), torch.ones(1, 2), t([1.0, -1.0]), t([2.0, 0.5]))
    assert loss.item() == pytest.approx(0.346574, abs=1e-5) and m["pg_loss"] == pytest.approx(loss.item())
    loss.backward()
    assert close(logprob.grad, t([-1.0, 0.25]))  # -A w / 2
    # without weights: plain REINFORCE, -(ln 0.5 * 1 - ln 0.25) / 2 = -0.346574
    plain, _ = reinforce_is_loss(logprob.detach(), t([0.0, 0.0]), torch.ones(1, 2), t([1.0, -1.0]), None)
    assert plain.item() == pytest.approx(-0.346574, abs=1e-5)


def test_configured_correction_prefixes_and_skips_what_is_off() -> None:
    cfg = RolloutCorrectionConfig(rollout_is=None, rollout_rs="token_k1", rollout_rs_threshold=2.0)
    weights, keep, m = RolloutCorrection.from_config(cfg)(t([LN3, 0.0]), t([0.0, 0.0]), torch.ones(1, 2))
    assert weights is None and close(keep, t([0.0, 1.0]))
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)
    assert "rollout_corr/kl" in m and not any("rollout_is" in k for k in m)
    # on-policy data: every weight 1, nothing dropped
    on = RolloutCorrection.from_config(RolloutCorrectionConfig(rollout_is="token"))
    weights, keep, m = on(t([-1.0, -2.0]), t([-1.0, -2.0]), torch.ones(1, 2))
    assert close(weights, torch.ones(1, 2)) and close(keep, torch.ones(1, 2))
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.0) and m["rollout_corr/kl"] == 0.0
