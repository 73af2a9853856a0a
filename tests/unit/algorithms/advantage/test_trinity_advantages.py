"""Issue 20's advantage fns (Trinity v0.5.2 names) against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from services.algorithms.advantage import ADVANTAGE_FN, grpo, opmd
from services.algorithms.advantage.entropy_clip import clipb_keep, clipv_keep
from services.algorithms.advantage.external_signal import (
    jsd_advantages,
    on_policy_distill_advantages,
    remax_advantages,
)
from services.algorithms.advantage.group_variants import asymre_advantages, rec_advantages, reinforce
from services.algorithms.advantage.step_wise import step_wise_grpo_advantages
from services.common.errors import InvalidArgument
from tests.fakes.tensors import close, make_batch, t


def test_reinforce_is_the_raw_reward_on_every_token():
    # rewards 1 and 0 on the last token; mask row 2 = [1, 0] -> A = [[1, 1], [0, 0]]
    batch = make_batch(2, 2, token_level_rewards=t([0.0, 1.0], [0.0, 0.0]), action_mask=t([1, 1], [1, 0]))
    out = reinforce(batch)
    assert close(out.advantages, t([1.0, 1.0], [0.0, 0.0]))
    assert out.metrics["reward_mean"] == pytest.approx(0.5)


def test_asymre_shifts_the_group_mean_and_leaves_singletons_unbaselined():
    # group 0: rewards 1, 0 -> mean 0.5, baseline 0.5 + (-0.1) = 0.4 -> A = 0.6, -0.4
    # group 1: one row, reward 2 -> baseline 0 -> A = 2
    adv = asymre_advantages(t(1.0, 0.0, 2.0), torch.ones(3, 2), torch.tensor([0, 0, 1]))
    assert close(adv, t([0.6, 0.6], [-0.4, -0.4], [2.0, 2.0]))
    # baseline_shift 0.2: baseline 0.7 -> A = 0.3, -0.7
    adv = asymre_advantages(t(1.0, 0.0), torch.ones(2, 1), torch.tensor([0, 0]), baseline_shift=0.2)
    assert close(adv[:, 0], t(0.3, -0.7))


def test_rec_centres_on_the_group_mean():
    # rewards 1, 0, 0, 0 -> mean 0.25 -> A = 0.75, -0.25, -0.25, -0.25
    adv, keep = rec_advantages(t(1.0, 0.0, 0.0, 0.0), torch.ones(4, 1), torch.zeros(4, dtype=torch.long))
    assert close(adv[:, 0], t(0.75, -0.25, -0.25, -0.25)) and bool(keep.all())


def test_rec_std_normalize_uses_the_population_std():
    # population std: sqrt((0.75^2 + 3 * 0.25^2) / 4) = sqrt(0.1875) = 0.4330127
    # A = 0.75 / (0.4330127 + 1e-6) = 1.732047, -0.25 / (0.4330127 + 1e-6) = -0.577349
    adv, _ = rec_advantages(
        t(1.0, 0.0, 0.0, 0.0), torch.ones(4, 1), torch.zeros(4, dtype=torch.long), std_normalize=True
    )
    std = math.sqrt(0.1875)
    assert close(adv[:, 0], t(0.75 / (std + 1e-6), *[-0.25 / (std + 1e-6)] * 3))


def test_rec_balance_drops_extra_negatives():
    # 1 positive (>= mean 0.25), 3 negatives -> 2 negatives dropped at random; kept rewards 1, 0:
    # mean 0.5 -> A = +0.5 on the positive, -0.5 on the kept negative, 0 on the dropped two
    gen = torch.Generator().manual_seed(0)
    adv, keep = rec_advantages(
        t(1.0, 0.0, 0.0, 0.0),
        torch.ones(4, 1),
        torch.zeros(4, dtype=torch.long),
        drop="balance",
        generator=gen,
    )
    assert bool(keep[0]) and int(keep.sum()) == 2
    assert sorted(adv[:, 0].tolist()) == pytest.approx([-0.5, 0.0, 0.0, 0.5])
    with pytest.raises(InvalidArgument, match="drop"):
        rec_advantages(t(1.0), torch.ones(1, 1), torch.zeros(1, dtype=torch.long), drop="random")


def test_remax_subtracts_the_greedy_baseline_from_the_return_to_go():
    # token rewards [0.5, 1] -> returns-to-go [1.5, 1]; baseline 0.4 -> A = [1.1, 0.6]
    adv, ret = remax_advantages(t([0.5, 1.0]), t(0.4), t([1.0, 1.0]))
    assert close(ret, t([1.5, 1.0])) and close(adv, t([1.1, 0.6]))


def test_on_policy_distill_is_the_scaled_teacher_minus_student_logprob():
    # kl_coef 2: 2 * ([-1, -2] - [-1.5, -1]) = [1, -2]; masked second token -> 0
    adv = on_policy_distill_advantages(t([-1.0, -2.0]), t([-1.5, -1.0]), t([1.0, 1.0]), kl_coef=2.0)
    assert close(adv, t([1.0, -2.0]))
    adv = on_policy_distill_advantages(t([-1.0, -2.0]), t([-1.5, -1.0]), t([1.0, 0.0]))
    assert close(adv, t([0.5, 0.0]))


def test_jsd_is_minus_the_per_token_mixture_divergence():
    # student p_s = 0.5, teacher p_t = 0.25, lambda 0.5: M = 0.375
    # KL_t = 0.25 * ln(0.25 / 0.375) = -0.101366; KL_s = 0.5 * ln(0.5 / 0.375) = 0.143841
    # JSD = 0.5 * (-0.101366) + 0.5 * 0.143841 = 0.021237 -> A = -kl_coef * JSD
    teacher, student = t([math.log(0.25)]), t([math.log(0.5)])
    assert jsd_advantages(teacher, student, t([1.0])).item() == pytest.approx(-0.021237, abs=1e-5)
    assert jsd_advantages(teacher, student, t([1.0]), kl_coef=2.0).item() == pytest.approx(
        -0.042475, abs=1e-5
    )
    assert jsd_advantages(teacher, student, t([1.0]), lambda_coef=1.0).item() == 0.0


@pytest.mark.parametrize("name", ["remax", "on_policy_distill", "jsd", "step_wise_grpo", "clipb", "clipv"])
def test_parts_needing_missing_data_fail_with_the_field(name):
    with pytest.raises(InvalidArgument, match=name) as err:
        ADVANTAGE_FN.get(name)(make_batch(2, 2, token_level_rewards=torch.zeros(2, 2)))
    assert err.value.field == "algorithm.advantage_fn"


def test_verl_copies_give_the_same_numbers():
    assert ADVANTAGE_FN.get("grpo_verl") is grpo.grpo
    assert ADVANTAGE_FN.get("opmd_verl") is opmd.opmd
    assert ADVANTAGE_FN.get("asymre_verl") is ADVANTAGE_FN.get("asymre")


def test_step_wise_grpo_broadcasts_each_runs_final_reward_advantage():
    # task 0: run 10 (steps 0, 1; final reward 1), run 11 (one step, reward 0); task 1: run 20 (reward 5)
    # task 0 finals 1, 0 -> mean 0.5, unbiased std sqrt(0.5) = 0.707107 -> A = +-0.5 / 0.707107 = +-0.707106
    # task 1 has one run: mean 0, std 1 -> A = 5 / (1 + 1e-6)
    # the first step of run 10 carries reward 0 but gets its run's advantage
    rewards = t(0.0, 1.0, 0.0, 5.0)
    task, run, step = torch.tensor([0, 0, 0, 1]), torch.tensor([10, 10, 11, 20]), torch.tensor([0, 1, 0, 0])
    adv, keep = step_wise_grpo_advantages(rewards, torch.ones(4, 1), task, run, step)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert close(adv[:, 0], t(a, a, -a, 5 / (1 + 1e-6))) and bool(keep.all())
    # enable_step_norm: run 10 has 2 steps -> a / 2 on both
    adv, _ = step_wise_grpo_advantages(rewards, torch.ones(4, 1), task, run, step, enable_step_norm=True)
    assert close(adv[:, 0], t(a / 2, a / 2, -a, 5 / (1 + 1e-6)))
    # std_threshold 0: task 1 (one run) is dropped
    adv, keep = step_wise_grpo_advantages(rewards, torch.ones(4, 1), task, run, step, std_threshold=0.0)
    assert keep.tolist() == [True, True, True, False] and adv[3, 0].item() == 0.0


def test_step_wise_grpo_batch_std():
    # finals 1, 0 (task 0) and 5 (task 1): batch std of [1, 0, 5] = sqrt(((1-2)^2 + 4 + 9) / 2) = sqrt(7)
    # task 0: (1 - 0.5) / sqrt(7) = 0.188982; task 1 (single run, mean 0): 5 / sqrt(7) = 1.889822
    rewards = t(1.0, 0.0, 5.0)
    task, run, step = torch.tensor([0, 0, 1]), torch.tensor([1, 2, 3]), torch.zeros(3, dtype=torch.long)
    adv, _ = step_wise_grpo_advantages(
        rewards, torch.ones(3, 1), task, run, step, std_cal_level="batch", epsilon=0.0
    )
    assert close(adv[:, 0], t(0.5 / math.sqrt(7), -0.5 / math.sqrt(7), 5 / math.sqrt(7)))


def test_clipb_drops_negative_tokens_with_a_low_entropy_signal():
    # logprob 0 (p = 1) -> S = H = [0, 0, 0, 4]; mean 1, population std sqrt((1 + 1 + 1 + 9) / 4) = 1.732
    # z = S - mean = [-1, -1, -1, 3]; mu 0.5 -> threshold -0.866: A = [1, -1, 0, -1]
    # token 0 (A > 0) kept; token 1 (A < 0, z = -1) dropped; token 2 (A = 0) kept; token 3 (z = 3) kept
    keep = clipb_keep(
        t([1.0, -1.0, 0.0, -1.0]), torch.zeros(1, 4), t([0.0, 0.0, 0.0, 4.0]), torch.ones(1, 4), mu=0.5
    )
    assert keep.tolist() == [[1.0, 0.0, 1.0, 1.0]]
    # a flat signal keeps everything
    keep = clipb_keep(t([-1.0, -1.0]), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))
    assert keep.tolist() == [[1.0, 1.0]]


def test_clipv_caps_how_many_tokens_it_drops():
    # logprob 0, H 0 -> S = 0, D = N = [5, 4, 0, 0]; mean 2.25, population std sqrt(20.75 / 4) = 2.2776
    # mu 0.5 -> keep D <= 1.1388: tokens 0 and 1 (all A = -1) would go, 2 of 4 = 0.5 of the tokens
    args = (
        -torch.ones(1, 4),
        torch.zeros(1, 4),
        torch.zeros(1, 4),
        t([5.0, 4.0, 0.0, 0.0]),
        torch.ones(1, 4),
    )
    assert clipv_keep(*args, mu=0.5, max_frac=0.5).tolist() == [[0.0, 0.0, 1.0, 1.0]]
    # max_frac 1e-4: budget max(int(4e-4), 1) = 1 -> only the largest D (token 0) is dropped
    assert clipv_keep(*args, mu=0.5).tolist() == [[0.0, 1.0, 1.0, 1.0]]
