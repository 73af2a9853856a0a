"""Advantage fns against hand-derived numbers (GRPO, RLOO, OPMD, REINFORCE++, GAE)."""

from __future__ import annotations

import math

import pytest
import torch

from services.algorithms.advantage.gae import gae_advantages
from services.algorithms.advantage.grpo import grpo, grpo_advantages
from services.algorithms.advantage.opmd import opmd_advantages
from services.algorithms.advantage.reinforce_pp import reinforce_plus_plus_advantages
from services.algorithms.advantage.rloo import rloo_advantages
from services.common.errors import InvalidArgument
from tests.fakes.tensors import close, make_batch, t

# Groups: 0 -> rewards 1, 2, 3;  1 -> single reward 5;  2 -> rewards 2, 2 (no spread).
SCORES = t(1, 2, 3, 5, 2, 2)
GROUPS = torch.tensor([0, 0, 0, 1, 2, 2])
MASK = torch.ones(6, 2)


def test_grpo_group_mean_and_unbiased_std():
    # group 0: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1 -> (r - 2) / (1 + 1e-6) = -0.999999, 0, 0.999999
    # group 1 (one row): mean 0, std 1 -> 5 / (1 + 1e-6) = 4.999995
    # group 2: mean 2, std 0 -> 0 / 1e-6 = 0
    adv, keep, metrics = grpo_advantages(SCORES, MASK, GROUPS)
    expected = t(-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6), 5 / (1 + 1e-6), 0.0, 0.0)
    assert close(adv[:, 0], expected) and close(adv[:, 1], expected)
    assert bool(keep.all())
    # group means (2, 0, 2) -> mean 4/3; stds (1, 1, 0) -> mean 2/3, max 1, min 0
    assert metrics["group_advantages/reward_mean/mean"] == pytest.approx(4 / 3)
    assert metrics["group_advantages/reward_std/mean"] == pytest.approx(2 / 3)
    assert metrics["group_advantages/reward_std/min"] == 0.0
    assert metrics["filtered_count"] == 0.0


def test_grpo_group_of_equal_scores_has_exactly_zero_advantage():
    # eight 0.1s: the float32 mean is 0.10000000149 and (0.1 - mean) / (0 + 1e-6) would be -0.0075;
    # R_i - mean(R) is 0 for equal scores, so the advantage is exactly 0 (and the trainer may skip them)
    scores = torch.tensor([0.1] * 8 + [0.1] * 7 + [0.5], dtype=torch.float32)
    groups = torch.tensor([0] * 8 + [1] * 8)
    adv, _, _ = grpo_advantages(scores, torch.ones(16, 1), groups)
    assert adv[:8].abs().max().item() == 0.0
    # group 1: mean 0.15, unbiased std sqrt((7 * 0.05^2 + 0.35^2) / 7) = 0.141421: 0.35 / 0.141421 = 2.474874
    assert close(adv[15, 0], 0.35 / (0.1414214 + 1e-6), atol=1e-4)
    adv_b, _, _ = grpo_advantages(scores, torch.ones(16, 1), groups, std_cal_level="batch")
    assert adv_b[:8].abs().max().item() == 0.0


def test_grpo_advantage_is_zero_on_masked_tokens():
    mask = t([1, 0], [1, 1], [1, 1], [1, 1], [1, 1], [1, 1])
    adv, _, _ = grpo_advantages(SCORES, mask, GROUPS)
    assert adv[0, 1].item() == 0.0 and adv[0, 0].item() < 0


def test_grpo_std_threshold_drops_flat_groups_and_singletons():
    # std_threshold 0: group 1 (single row) and group 2 (std 0 <= 0) are dropped -> 3 rows filtered
    adv, keep, metrics = grpo_advantages(SCORES, MASK, GROUPS, std_threshold=0.0)
    assert keep.tolist() == [True, True, True, False, False, False]
    assert metrics["filtered_count"] == 3.0
    assert close(adv[3:], torch.zeros(3, 2))


def test_grpo_batch_level_std():
    # rewards 1,2,3 (task 0) and 11,12,13 (task 1); batch std: mean 7, squared deviations
    # 36+25+16+16+25+36 = 154, /5 = 30.8, sqrt = 5.549775. Row with reward 3: (3 - 2) / (5.549775 + 1e-7)
    scores = t(1, 2, 3, 11, 12, 13)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, _, _ = grpo_advantages(scores, torch.ones(6, 1), groups, epsilon=1e-7, std_cal_level="batch")
    assert close(adv[2, 0], 1 / 5.549775)
    assert close(adv[3, 0], -1 / 5.549775)


def test_grpo_rejects_unknown_std_level():
    with pytest.raises(InvalidArgument) as err:
        grpo_advantages(SCORES, MASK, GROUPS, std_cal_level="task")
    assert err.value.field == "algorithm.advantage_fn_args.std_cal_level"


def test_grpo_adapter_sums_token_level_rewards_and_returns_equal_advantages():
    # scores are token sums: row 0 = 0 + 1 = 1, row 1 = 3 + 0 = 3 -> mean 2, std sqrt(2) = 1.414214
    batch = make_batch(2, 2, token_level_rewards=t([0, 1], [3, 0]))
    out = grpo(batch)
    assert close(out.advantages[:, 0], t(-1 / (math.sqrt(2) + 1e-6), 1 / (math.sqrt(2) + 1e-6)))
    assert torch.equal(out.advantages, out.returns) and out.keep is None


def test_rloo_leave_one_out():
    # group 0 (1, 2, 3): 1 - mean(2, 3) = -1.5, 2 - mean(1, 3) = 0, 3 - mean(1, 2) = 1.5; single row keeps 5;
    # group 2 (2, 2): 0, 0
    adv = rloo_advantages(SCORES, MASK, GROUPS)
    assert close(adv[:, 0], t(-1.5, 0.0, 1.5, 5.0, 0.0, 0.0))


def test_opmd_mean_baseline():
    # reward minus group mean; single row has baseline 0
    adv = opmd_advantages(SCORES, MASK, GROUPS)
    assert close(adv[:, 1], t(-1.0, 0.0, 1.0, 5.0, 0.0, 0.0))


def test_opmd_logavgexp_baseline():
    # rewards 0, 1, tau 1: b = log((e^0 + e^1) / 2) = log(1.859141) = 0.620115 -> A = -0.620115, 0.379885
    # tau 0.5: b = 0.5 * log((1 + e^2) / 2) = 0.5 * log(4.194528) = 0.716890
    scores, groups = t(0, 1), torch.tensor([7, 7])
    adv = opmd_advantages(scores, torch.ones(2, 1), groups, opmd_baseline="logavgexp", tau=1.0)
    assert close(adv[:, 0], t(-0.620115, 0.379885))
    adv = opmd_advantages(scores, torch.ones(2, 1), groups, opmd_baseline="logavgexp", tau=0.5)
    assert close(adv[:, 0], t(-0.716890, 1 - 0.716890))


def test_reinforce_plus_plus_discounted_returns_whitened():
    # gamma 0.5: row 0 rewards [0, 1] -> returns [0 + 0.5 * 1, 1] = [0.5, 1]; row 1 [0, 0] -> [0, 0]
    # whiten over 4 tokens: mean 0.375, deviations 0.125, 0.625, -0.375, -0.375; squares sum 0.6875,
    # unbiased var 0.6875 / 3 = 0.229167, std 0.478714 -> adv 0.261116, 1.305582, -0.783349, -0.783349
    adv, ret = reinforce_plus_plus_advantages(t([0, 1], [0, 0]), torch.ones(2, 2), gamma=0.5)
    assert close(ret, t([0.5, 1.0], [0.0, 0.0]))
    assert close(adv, t([0.261116, 1.305582], [-0.783349, -0.783349]))


def test_gae_gamma_lambda_one():
    # rewards [0, 1], values [0.5, 0.2]; t=1: delta = 1 + 0 - 0.2 = 0.8 -> A1 = 0.8
    # t=0: delta = 0 + 0.2 - 0.5 = -0.3 -> A0 = -0.3 + 0.8 = 0.5; returns = A + V = [1.0, 1.0]
    # whiten [0.5, 0.8]: mean 0.65, unbiased std 0.212132 -> [-0.707107, 0.707107]
    adv, ret = gae_advantages(t([0, 1]), t([0.5, 0.2]), torch.ones(1, 2))
    assert close(ret, t([1.0, 1.0]))
    assert close(adv, t([-0.707107, 0.707107]))


def test_gae_discount_and_lambda():
    # gamma 0.9, lam 0.5: A1 = 0.8; delta0 = 0 + 0.9 * 0.2 - 0.5 = -0.32, A0 = -0.32 + 0.45 * 0.8 = 0.04
    # returns = [0.04 + 0.5, 0.8 + 0.2] = [0.54, 1.0]
    _, ret = gae_advantages(t([0, 1]), t([0.5, 0.2]), torch.ones(1, 2), gamma=0.9, lam=0.5)
    assert close(ret, t([0.54, 1.0]))
