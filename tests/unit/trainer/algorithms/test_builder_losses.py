"""The composed Algorithm end to end: advantages, policy loss, KL, entropy and value loss of a built
algorithm on small batches, each checked against the value derived by hand in its comments."""

from __future__ import annotations

import pytest
import torch

from services.common.config.algorithm import AlgorithmConfig
from services.trainer.algorithms import build_algorithm
from tests.fakes.tensors import close, make_batch, t


def _grpo_batch() -> tuple:
    # one group, rewards [1, 0]: mean 0.5, std sqrt(0.5) = 0.707107 -> A = +-0.5 / (0.707107 + 1e-6) = +-0.707106
    batch = make_batch(2, 2, rewards=t(1.0, 0.0), ref_logprob=torch.zeros(2, 2))
    logprob = t([0.1, 0.1], [0.0, 0.0]).requires_grad_(True)
    return batch, logprob


def test_grpo_total_loss_by_hand():
    # pg: row 0 ratio e^0.1 = 1.105171 (inside clip), A = +0.707106 -> -0.781473 per token
    #     row 1 ratio 1, A = -0.707106 -> +0.707106 per token; token-mean over 4 = -0.037183
    # kl loss k2: d = [0.1, 0.1, 0, 0] -> d^2/2 = 0.005, 0.005, 0, 0 -> mean 0.0025 * 0.001 = 0.0000025
    # entropy: coef 0.1 * mean(1) = 0.1, subtracted. total = -0.037183 + 0.0000025 - 0.1 = -0.137181
    algo = build_algorithm(AlgorithmConfig(algorithm_type="grpo", entropy_loss_fn_args={"entropy_coef": 0.1}))
    batch, logprob = _grpo_batch()
    algo.compute_advantages(batch)
    assert close(batch.advantages, t([0.707106, 0.707106], [-0.707106, -0.707106]))
    loss, m = algo.compute_loss(batch, logprob, torch.ones(2, 2))
    assert loss.item() == pytest.approx(-0.137181, abs=1e-5)
    assert m["pg_loss"] == pytest.approx(-0.037183, abs=1e-5)
    assert m["kl_loss"] == pytest.approx(0.0025) and m["kl_coef"] == 0.001
    assert m["entropy_loss"] == pytest.approx(1.0)
    assert {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"} <= set(m)
    # loss_scale multiplies the loss, not the metrics
    half, m_half = algo.compute_loss(batch, logprob, torch.ones(2, 2), loss_scale=0.5)
    assert half.item() == pytest.approx(loss.item() / 2) and m_half["pg_loss"] == m["pg_loss"]


def test_micro_batches_with_loss_scale_sum_to_the_full_batch_loss():
    # token-mean with equal row lengths: loss(full) = sum over micro-batches of loss(mb) * rows(mb) / rows
    algo = build_algorithm(AlgorithmConfig(algorithm_type="grpo"))
    torch.manual_seed(0)
    batch = make_batch(
        4,
        3,
        rewards=t(1.0, 0.0, 0.5, 2.0),
        group_index=torch.tensor([0, 0, 1, 1]),
        old_logprob=-torch.rand(4, 3),
        ref_logprob=-torch.rand(4, 3),
    )
    algo.compute_advantages(batch)
    logprob = -torch.rand(4, 3)
    full, _ = algo.compute_loss(batch, logprob, None)
    parts = [
        algo.compute_loss(batch.select(idx), logprob[idx], None, loss_scale=len(idx) / 4)[0]
        for idx in (torch.tensor([0, 2, 3]), torch.tensor([1]))
    ]
    assert sum(p.item() for p in parts) == pytest.approx(full.item(), abs=1e-6)


def test_token_scale_makes_micro_batches_of_unequal_lengths_add_up_to_the_batch_token_mean():
    # Rows of 3, 1, 2 and 1 action tokens (7 in all). By hand, with old logprobs 0 and A = +1 for rows
    # 0-1 and -1 for rows 2-3 (rewards 1, 0 | 1, 0: one group each), logprob 0: ratio 1, per-token
    # pg = -A: tokens of rows 0, 1 give -1 (4 tokens), of rows 2, 3 give +1 (3 tokens), scaled by
    # 1 / (std 0.707107 + 1e-6) = 1.414212. Token-mean over 7: (-4 + 3) / 7 * 1.414212 = -0.202030.
    # Entropy (coef 0.1, token-mean): entropies 1 on rows 0-1 and 3 on rows 2-3: (4 + 9) / 7 = 1.857143.
    # Total: -0.202030 - 0.185714 = -0.387744. Split {0, 2} (5 tokens, 2 rows) and {1, 3} (2 tokens):
    # by row shares each half counts 1/2, which weighs row 1's and 3's lone tokens 2.5 times as much.
    algo = build_algorithm(
        AlgorithmConfig(algorithm_type="grpo", kl_loss_fn="none", entropy_loss_fn_args={"entropy_coef": 0.1})
    )
    mask = t([1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0])
    batch = make_batch(
        4, 3, action_mask=mask, rewards=t(1.0, 0.0, 1.0, 0.0), group_index=torch.tensor([0, 0, 1, 1])
    )
    batch.advantages = t([1.0] * 3, [1.0] * 3, [-1.0] * 3, [-1.0] * 3) * 1.414212
    logprob, entropy = torch.zeros(4, 3), t([1.0] * 3, [1.0] * 3, [3.0] * 3, [3.0] * 3)
    full, _ = algo.compute_loss(batch, logprob, entropy)
    assert full.item() == pytest.approx(-0.387744, abs=1e-5)
    halves = [torch.tensor([0, 2]), torch.tensor([1, 3])]
    by_tokens = sum(
        algo.compute_loss(
            batch.select(i), logprob[i], entropy[i], loss_scale=0.5, token_scale=float(mask[i].sum()) / 7
        )[0].item()
        for i in halves
    )
    by_rows = sum(
        algo.compute_loss(batch.select(i), logprob[i], entropy[i], loss_scale=0.5)[0].item() for i in halves
    )
    assert by_tokens == pytest.approx(full.item(), abs=1e-5)
    # rows' shares: {0, 2}: pg (-3 + 2) / 5 * 1.414212 = -0.282842, ent 0.1 * (3 + 6) / 5 = 0.18;
    # {1, 3}: pg (-1 + 1) / 2 = 0, ent 0.1 * (1 + 3) / 2 = 0.2; 0.5 * (-0.462842) + 0.5 * (-0.2) = -0.331421
    assert by_rows == pytest.approx(-0.331421, abs=1e-5)


def test_token_scale_leaves_a_sequence_mean_policy_loss_on_row_shares():
    # seq-mean-token-mean weighs rows alike: the row share is already exact for it, the token share is not used
    algo = build_algorithm(
        AlgorithmConfig(algorithm_type="grpo", kl_loss_fn="none", loss_agg_mode="seq-mean-token-mean")
    )
    mask = t([1, 1, 1], [1, 0, 0])
    batch = make_batch(2, 3, action_mask=mask, rewards=t(1.0, 0.0))
    batch.advantages = t([1.0] * 3, [-1.0] * 3)
    logprob = torch.zeros(2, 3)
    full, _ = algo.compute_loss(batch, logprob, None)  # (-1 + 1) / 2 = 0
    parts = [
        algo.compute_loss(
            batch.select(i), logprob[i], None, loss_scale=0.5, token_scale=float(mask[i].sum()) / 4
        )[0]
        for i in (torch.tensor([0]), torch.tensor([1]))
    ]
    assert full.item() == pytest.approx(0.0, abs=1e-6)
    assert [p.item() for p in parts] == pytest.approx([-0.5, 0.5], abs=1e-6)


def test_mix_weights_keep_each_side_a_mean_over_its_rows_across_micro_batches():
    # 2 usual rows + 2 expert rows. Full batch: 0.9 * PPO(usual) + 0.1 * SFT(expert), each a mean over
    # its own rows. Split into micro-batches {usual, usual, expert} and {expert}: the weights
    # n_side_in_mb / n_side_in_batch / loss_scale make the sum equal the full-batch loss.
    algo = build_algorithm(AlgorithmConfig(algorithm_type="mix", kl_loss_fn="none"))
    batch = make_batch(
        4,
        2,
        rewards=t(1.0, 0.0, 0.0, 0.0),
        group_index=torch.tensor([0, 0, 1, 1]),
        old_logprob=torch.full((4, 2), -1.0),
        is_expert=torch.tensor([False, False, True, True]),
    )
    algo.compute_advantages(batch)
    assert close(batch.advantages[2:], torch.zeros(2, 2))  # expert rows get no advantage
    logprob = t([-0.9, -0.9], [-1.0, -1.0], [-2.0, -2.0], [-4.0, -4.0])
    full, m = algo.compute_loss(batch, logprob, None)
    # usual: A = +-0.707106; row 0 ratio e^0.1 -> -0.781473, row 1 ratio 1 -> +0.707106: pg = -0.037183
    # expert: sequence means 2 and 4 -> sft 3. total = 0.9 * -0.037183 + 0.1 * 3 = 0.266535
    assert full.item() == pytest.approx(0.266535, abs=1e-5)
    assert m["expert/sft_loss"] == pytest.approx(3.0)
    idx_a, idx_b = torch.tensor([0, 1, 2]), torch.tensor([3])
    part_a, _ = algo.compute_loss(batch.select(idx_a), logprob[idx_a], None, loss_scale=3 / 4)
    part_b, _ = algo.compute_loss(batch.select(idx_b), logprob[idx_b], None, loss_scale=1 / 4)
    assert part_a.item() + part_b.item() == pytest.approx(full.item(), abs=1e-5)


def test_std_threshold_masks_dropped_rows():
    algo = build_algorithm(AlgorithmConfig(algorithm_type="grpo", advantage_fn_args={"std_threshold": 0.0}))
    batch = make_batch(4, 2, rewards=t(1.0, 0.0, 0.5, 0.5), group_index=torch.tensor([0, 0, 1, 1]))
    metrics = algo.compute_advantages(batch)
    assert metrics["filtered_count"] == 2.0
    assert close(batch.action_mask, t([1, 1], [1, 1], [0, 0], [0, 0]))


def test_kl_penalty_shapes_rewards_before_the_advantage():
    # reinforce++ with k1 penalty coef 0.5: one row, reward 1 on the last token, old - ref = [0.2, 0.2]
    # token rewards = [0 - 0.1, 1 - 0.1] = [-0.1, 0.9]; returns (gamma 1) = [0.8, 0.9]
    algo = build_algorithm(
        AlgorithmConfig(
            algorithm_type="reinforceplusplus", kl_penalty_fn="k1", kl_penalty_fn_args={"kl_coef": 0.5}
        )
    )
    batch = make_batch(
        1, 2, rewards=t(1.0), old_logprob=torch.full((1, 2), -1.0), ref_logprob=torch.full((1, 2), -1.2)
    )
    metrics = algo.compute_advantages(batch)
    assert close(batch.token_level_rewards, t([-0.1, 0.9]))
    assert close(batch.returns, t([0.8, 0.9]))
    assert metrics["kl"] == pytest.approx(0.2) and metrics["kl_coef"] == 0.5


def test_reward_lands_on_the_last_action_token():
    algo = build_algorithm(AlgorithmConfig(algorithm_type="reinforceplusplus", kl_loss_fn="none"))
    batch = make_batch(2, 3, rewards=t(1.0, 2.0), action_mask=t([1, 1, 0], [1, 1, 1]))
    algo.compute_advantages(batch)
    assert close(batch.token_level_rewards, t([0.0, 1.0, 0.0], [0.0, 0.0, 2.0]))


def test_ppo_with_critic_adds_value_loss():
    algo = build_algorithm(AlgorithmConfig(algorithm_type="ppo", kl_loss_fn="none"))
    batch = make_batch(1, 2, rewards=t(1.0), values=t([0.5, 0.2]))
    algo.compute_advantages(batch)
    # GAE (gamma = lam = 1): returns [1, 1] (see test_advantages); advantages whitened [-0.707107, 0.707107]
    assert close(batch.returns, t([1.0, 1.0]))
    vpreds = t([1.0, 0.0]).requires_grad_(True)
    loss, m = algo.compute_loss(batch, torch.zeros(1, 2), None, vpreds)
    # ratio 1: pg = mean(-0.707107 * -1, -0.707107) = 0. value loss, old values [0.5, 0.2], clip 0.5:
    # tok 1: vpred 1, clamp(1, 0, 1) = 1, return 1 -> 0; tok 2: vpred 0, clamp(0, -0.3, 0.7) = 0, return 1 -> 1
    # 0.5 * mean(0, 1) = 0.25
    assert m["vf_loss"] == pytest.approx(0.25)
    assert loss.item() == pytest.approx(0.25, abs=1e-6)


def test_sft_and_dpo_run_without_advantages():
    sft = build_algorithm(AlgorithmConfig(algorithm_type="sft"))
    batch = make_batch(1, 2)
    sft.compute_advantages(batch)
    loss, m = sft.compute_loss(batch, t([-1.0, -3.0]), None)
    assert loss.item() == pytest.approx(2.0) and m == {"sft_loss": pytest.approx(2.0)}
    dpo = build_algorithm(AlgorithmConfig(algorithm_type="dpo", kl_loss_fn="none"))
    batch = make_batch(2, 2, ref_logprob=torch.full((2, 2), -1.5), pair_index=torch.tensor([0, 0]))
    loss, m = dpo.compute_loss(batch, t([-1.0, -1.0], [-2.0, -2.0]), None)
    assert loss.item() == pytest.approx(0.598139, abs=1e-5)  # see test_policy_losses
