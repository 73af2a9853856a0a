"""Issue 20's policy losses and KL fn (Trinity v0.5.2 names) against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from services.common.errors import InvalidArgument
from services.trainer.algorithms.kl import KLTerm, kl_corrected_k3
from services.trainer.algorithms.policy_loss.chord import mix_chord, mu_schedule, sft_is_loss, sft_phi_loss
from services.trainer.algorithms.policy_loss.mix import mix
from services.trainer.algorithms.policy_loss.ppo import ppo_policy_loss
from services.trainer.algorithms.policy_loss.rec import rec_policy_loss
from services.trainer.algorithms.policy_loss.reinforce_family import (
    importance_sampling_policy_loss,
    sppo_policy_loss,
    topr_policy_loss,
)
from services.trainer.algorithms.policy_loss.sapo import sapo_policy_loss
from tests.fakes.tensors import close, make_batch, t

LN2 = math.log(2.0)


def test_topr_truncates_the_ratio_only_on_non_positive_advantages():
    # row 0: A = 2 > 0 -> alpha 1; logprob ln 0.5 -> loss -2 * ln 0.5 = 1.386294
    # row 1: A = -1, ratio 0.25 / 0.5 = 0.5 -> alpha 0.5; loss -0.5 * (-1) * ln 0.25 = -0.693147
    # token mean: (1.386294 - 0.693147) / 2 = 0.346574
    logprob = torch.tensor([[math.log(0.5)], [math.log(0.25)]], requires_grad=True)
    old = t([math.log(0.25)], [math.log(0.5)])
    loss, m = topr_policy_loss(logprob, old, torch.ones(2, 1), t([2.0], [-1.0]))
    assert loss.item() == pytest.approx(0.346574, abs=1e-5)
    assert m["avg_alpha"] == pytest.approx(0.75)  # (1 + 0.5) / 2
    loss.backward()
    # alpha is a stop-gradient weight: d/dlogprob = -alpha * A / 2 = [-1, 0.25]
    assert close(logprob.grad, t([-1.0], [0.25]))


def test_sppo_drops_tokens_outside_the_symmetric_log_range():
    # epsilon 0.3: keep 1/1.3 = 0.769 <= ratio <= 1.3
    # token 1: log-ratio 0.1 (ratio 1.105, kept): -2 * 0.1 = -0.2; token 2: log-ratio 0.5 (1.649, dropped): 0
    loss, m = sppo_policy_loss(t([0.1, 0.5]), t([0.0, 0.0]), t([1.0, 1.0]), t([2.0, 2.0]))
    assert loss.item() == pytest.approx(-0.1) and m["pg_clipfrac"] == pytest.approx(0.5)


# tokens: (A, log-ratio) = (1, 0.1), (1, 0.3), (-1, -0.1), (-1, -0.3); ratios 1.105, 1.350, 0.905, 0.741
REC_LP = t([0.1, 0.3, -0.1, -0.3])
REC_ADV = t([1.0, 1.0, -1.0, -1.0])


def test_rec_clip_modes():
    zero, ones = torch.zeros(1, 4), torch.ones(1, 4)
    # none: -A * logr = -0.1, -0.3, -0.1, -0.3 -> mean -0.2
    loss, _ = rec_policy_loss(REC_LP, zero, ones, REC_ADV)
    assert loss.item() == pytest.approx(-0.2)
    # one-side (A > 0: ratio <= 1.2; A < 0: ratio >= 0.8): tokens 1 and 3 kept -> (-0.1 - 0.1) / 4 = -0.05
    loss, m = rec_policy_loss(REC_LP, zero, ones, REC_ADV, clip_mode="one-side")
    assert loss.item() == pytest.approx(-0.05) and m["pg_clipfrac"] == pytest.approx(0.5)
    # two-side ([0.8, 1.2] whatever the sign): same two tokens kept
    loss, _ = rec_policy_loss(REC_LP, zero, ones, REC_ADV, clip_mode="two-side")
    assert loss.item() == pytest.approx(-0.05)


def test_rec_importance_sampling_weight():
    # A' = A * ratio: -(1.105171 * 0.1) - (1.349859 * 0.3) - (0.904837 * 0.1) - (0.740818 * 0.3)
    #   = -0.110517 - 0.404958 - 0.090484 - 0.222245 = -0.828204 -> mean -0.207051
    loss, _ = rec_policy_loss(
        REC_LP, torch.zeros(1, 4), torch.ones(1, 4), REC_ADV, weight="importance_sampling"
    )
    assert loss.item() == pytest.approx(-0.207051, abs=1e-5)
    with pytest.raises(InvalidArgument, match="clip_mode"):
        rec_policy_loss(REC_LP, torch.zeros(1, 4), torch.ones(1, 4), REC_ADV, clip_mode="both")


def test_rec_loss_value_is_reinforce_on_logprob_not_the_log_ratio():
    # logprob -1, old -1.1, A = 1: -A * logprob = 1 (the log-ratio would give -0.1; same gradient)
    loss, _ = rec_policy_loss(t([-1.0]), t([-1.1]), t([1.0]), t([1.0]))
    assert loss.item() == pytest.approx(1.0)


def test_rec_ring_keeps_far_tokens_on_the_helpful_side():
    # eps 0.2, eps' 0.6 / 2.0. (A, ratio): (1, 0.3) kept (<= 0.4); (1, 0.5) dropped; (-1, 3.5) kept (>= 3);
    # (-1, 2) dropped. loss: (-ln 0.3 + ln 3.5) / 4 = (1.203973 + 1.252763) / 4 = 0.614184
    lp = torch.log(t([0.3, 0.5, 3.5, 2.0]))
    loss, m = rec_policy_loss(lp, torch.zeros(1, 4), torch.ones(1, 4), REC_ADV, clip_mode="ring")
    assert loss.item() == pytest.approx(0.614184, abs=1e-5) and m["pg_clipfrac"] == pytest.approx(0.5)


def test_rec_gspo_one_side_uses_the_sequence_ratio_and_sequence_mean():
    # row 0: log-ratios 0.3, 0.1 -> s = e^0.2 = 1.2214 > 1.2 with A = 1 -> both tokens dropped -> 0
    # row 1: log-ratios 0.1, 0.1 -> s = 1.105 kept -> -(0.1 + 0.1) / 2 = -0.1; mean over rows -0.05
    lp = t([0.3, 0.1], [0.1, 0.1])
    loss, m = rec_policy_loss(
        lp, torch.zeros(2, 2), torch.ones(2, 2), torch.ones(2, 2), clip_mode="gspo-one-side"
    )
    assert loss.item() == pytest.approx(-0.05) and m["pg_clipfrac"] == pytest.approx(0.5)


def test_rec_weights_and_regularisers():
    # weight advantage, temp 2: A' = 1 * e^(1/2) = 1.648721; logprob -1 -> 1.648721
    loss, _ = rec_policy_loss(t([-1.0]), t([-1.0]), t([1.0]), t([1.0]), weight="advantage", temp=2.0)
    assert loss.item() == pytest.approx(1.648721, abs=1e-5)
    # A = 0: only the regulariser. k2, coef 0.5: 0.5 * (-1 + 1.2)^2 = 0.02; forward-kl: -0.5 * -1 = 0.5
    loss, _ = rec_policy_loss(
        t([-1.0]), t([-1.2]), t([1.0]), t([0.0]), regularizer="k2", regularizer_coef=0.5
    )
    assert loss.item() == pytest.approx(0.02, abs=1e-6)
    loss, _ = rec_policy_loss(
        t([-1.0]), t([-1.2]), t([1.0]), t([0.0]), regularizer="forward-kl", regularizer_coef=0.5
    )
    assert loss.item() == pytest.approx(0.5)


def test_importance_sampling_is_the_unclipped_ratio_times_advantage():
    # ratios 2 and 0.5, A = 1 and -1: -2, +0.5 -> token mean -0.75; approx_kl mean(-ln2, ln2) = 0
    loss, m = importance_sampling_policy_loss(t([LN2, -LN2]), t([0.0, 0.0]), t([1.0, 1.0]), t([1.0, -1.0]))
    assert loss.item() == pytest.approx(-0.75)
    assert m["ratio/mean"] == pytest.approx(1.25) and m["approx_kl"] == pytest.approx(0.0, abs=1e-7)


def test_sapo_gate_at_ratio_one_and_its_gradient():
    # ratio 1 (logprob = old = ln 0.5): f = sigmoid(0) * 4 / tau = 2 / tau
    # A = 1 (tau_pos 1): -1 * 2 * ln 0.5 = 1.386294; A = -1 (tau_neg 1.05): (2 / 1.05) * ln 0.5 = -1.320280
    # token mean (1.386294 - 1.320280) / 2 = 0.033007
    logprob = torch.full((1, 2), math.log(0.5), requires_grad=True)
    loss, m = sapo_policy_loss(logprob, torch.full((1, 2), math.log(0.5)), torch.ones(1, 2), t([1.0, -1.0]))
    assert loss.item() == pytest.approx(0.033007, abs=1e-5)
    assert m["avg_soft_gate"] == pytest.approx((2.0 + 2.0 / 1.05) / 2) and m["pos_adv_frac"] == 0.5
    loss.backward()
    # the gate is a stop-gradient weight: d/dlogprob = -A * f / 2 = [-1, (2 / 1.05) / 2 = 0.952381]
    assert close(logprob.grad, t([-1.0, 0.952381]))


def test_sapo_off_policy_token_is_softly_gated():
    # ratio 0.5 / 0.25 = 2, A = 1, tau 1: f = sigmoid(1) * 4 = 0.7310586 * 4 = 2.924234
    # loss -2.924234 * ln 0.5 = 2.924234 * 0.693147 = 2.026925
    loss, _ = sapo_policy_loss(t([math.log(0.5)]), t([math.log(0.25)]), t([1.0]), t([1.0]))
    assert loss.item() == pytest.approx(2.026925, abs=1e-5)
    with pytest.raises(InvalidArgument, match="tau_pos"):
        sapo_policy_loss(t([0.0]), t([0.0]), t([1.0]), t([1.0]), tau_pos=1.1, tau_neg=1.0)


def test_sft_is_and_sft_phi_weights():
    lp = t([math.log(0.5), math.log(0.25)])
    # sft_is: -ln p * p = 0.693147 * 0.5 and 1.386294 * 0.25, both 0.346574 -> mean 0.346574
    loss, m = sft_is_loss(lp, torch.ones(1, 2))
    assert loss.item() == pytest.approx(0.346574, abs=1e-5) and "sft_is_loss" in m
    # sft_phi: phi = p (1 - p) = 0.25, 0.1875 -> 0.173287 and 0.259930 -> mean 0.216608
    loss, _ = sft_phi_loss(lp, torch.ones(1, 2))
    assert loss.item() == pytest.approx(0.216608, abs=1e-5)
    # cutoff_prob 0.5: logprob ln 0.8 clamped to ln 0.5; phi(0.8) = 0.16 -> 0.693147 * 0.16 = 0.110904
    loss, _ = sft_phi_loss(t([math.log(0.8)]), torch.ones(1, 1), cutoff_prob=0.5)
    assert loss.item() == pytest.approx(0.110904, abs=1e-5)


def test_mu_schedule_warms_up_then_cosine_decays():
    # warm-up 10, decay 20, peak 0.5, valley 0.1
    assert mu_schedule(5, 10, 20, 0.5, 0.1) == pytest.approx(0.25)  # 5/10 * 0.5
    assert mu_schedule(10, 10, 20, 0.5, 0.1) == pytest.approx(0.5)  # cos(0) -> peak
    assert mu_schedule(20, 10, 20, 0.5, 0.1) == pytest.approx(0.3)  # cos(pi/2) = 0 -> 0.4 * 0.5 + 0.1
    assert mu_schedule(30, 10, 20, 0.5, 0.1) == pytest.approx(0.1)


def test_mix_chord_combines_ppo_and_phi_weighted_sft():
    # row 0 usual, A = 1, ratio 1 -> PPO loss -1; row 1 expert, logprob ln 0.5 -> sft_phi 0.25 * 0.693147
    # mu 0.1 (defaults): 0.9 * -1 + 0.1 * 0.173287 = -0.882671
    batch = make_batch(
        2, 1, advantages=t([1.0], [0.0]), old_logprob=t([0.0], [0.0]), is_expert=torch.tensor([False, True])
    )
    logprob = t([0.0], [math.log(0.5)])
    loss, m = mix_chord(batch, logprob)
    assert loss.item() == pytest.approx(-0.882671, abs=1e-5) and m["mu"] == pytest.approx(0.1)
    # enable_phi_function false: plain SFT 0.693147 -> -0.9 + 0.069315 = -0.830685
    loss, _ = mix_chord(batch, logprob, enable_phi_function=False)
    assert loss.item() == pytest.approx(-0.830685, abs=1e-5)


def test_mix_chord_sft_loss_agg_mode():
    # expert rows only, plain SFT, mu 0.1: token-mean (1 + 3 + 4) / 3 -> 0.266667; row mean (2 + 4) / 2 -> 0.3
    batch = make_batch(
        2,
        2,
        action_mask=t([1, 1], [1, 0]),
        advantages=torch.zeros(2, 2),
        is_expert=torch.tensor([True, True]),
    )
    logprob = t([-1.0, -3.0], [-4.0, 0.0])
    assert mix_chord(batch, logprob, enable_phi_function=False)[0].item() == pytest.approx(0.8 / 3)
    loss, _ = mix_chord(
        batch,
        logprob,
        enable_phi_function=False,
        sft_loss_agg_mode="seq-mean-token-mean",
        use_dynamic_bsz=True,
        ppo_mini_batch_size=320,
        train_batch_size_expert=64,
    )
    assert loss.item() == pytest.approx(0.3)


def test_mix_sft_part_is_token_mean_by_default():
    # expert rows: [-1, -3] (2 tokens) and [-4] (1 token); usual rows none, mu 0.1
    # token-mean: (1 + 3 + 4) / 3 = 8/3 -> loss 0.1 * 8/3 = 0.266667
    # seq-mean-token-mean: (2 + 4) / 2 = 3 -> loss 0.3
    batch = make_batch(
        2,
        2,
        action_mask=t([1, 1], [1, 0]),
        advantages=torch.zeros(2, 2),
        is_expert=torch.tensor([True, True]),
    )
    logprob = t([-1.0, -3.0], [-4.0, 0.0])
    assert mix(batch, logprob)[0].item() == pytest.approx(0.8 / 3)
    assert mix(batch, logprob, sft_loss_agg_mode="seq-mean-token-mean")[0].item() == pytest.approx(0.3)
    assert mix(batch, logprob, use_token_level_loss_in_sft=False)[0].item() == pytest.approx(0.3)
    # v0.5.2's batch-size arguments are accepted (weights come from the real row counts)
    loss, _ = mix(batch, logprob, train_batch_size_usual=4, train_batch_size_expert=4, ppo_mini_batch_size=8)
    assert loss.item() == pytest.approx(0.8 / 3)
    with pytest.raises(InvalidArgument, match="same setting"):
        mix(batch, logprob, sft_loss_agg_mode="token-mean", use_token_level_loss_in_sft=True)


def test_ppo_sequence_masking_zeroes_negative_tokens_of_far_off_policy_rows():
    # both rows: log-ratio -0.2 per token -> ratio 0.818731 (inside [0.8, 1.2]); sequence KL 0.2 > 0.1
    # row 0: A = -1 -> loss +0.818731 per token, masked; row 1: A = +1 -> -0.818731 per token, kept
    # unmasked token mean: 0; masked: (2 * -0.818731) / 4 = -0.409365
    args = (t([-0.2, -0.2], [-0.2, -0.2]), torch.zeros(2, 2), torch.ones(2, 2), t([-1.0, -1.0], [1.0, 1.0]))
    plain, _ = ppo_policy_loss(*args)
    assert plain.item() == pytest.approx(0.0, abs=1e-6)
    loss, m = ppo_policy_loss(*args, enable_sequence_masking=True)
    assert loss.item() == pytest.approx(-0.409365, abs=1e-5)
    assert m["seq_mask/masked_tokens"] == pytest.approx(0.5)
    assert m["seq_mask/mean_sequence_kl"] == pytest.approx(0.2)
    # delta 0.3 > 0.2: nothing masked
    loss, _ = ppo_policy_loss(*args, enable_sequence_masking=True, delta_sequence_masking=0.3)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)


def test_ppo_fallback_to_policy_gradient_ignores_behaviour_logprobs():
    # old_logprob -5 would give ratio e^5 -> clipped at 1.2 -> -1.2; fallback: ratio 1 -> -1
    logprob = torch.zeros(1, 1, requires_grad=True)
    loss, _ = ppo_policy_loss(logprob, t([-5.0]), t([1.0]), t([1.0]), fallback_to_policy_gradient=True)
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert close(logprob.grad, t([-1.0]))


def test_corrected_k3_weights_k3_by_the_clamped_importance_ratio():
    # logprob 0, ref ln 0.5: k3 = 0.5 - 1 - ln 0.5 = 0.193147
    lp, ref = t([0.0]), t([math.log(0.5)])
    assert kl_corrected_k3(lp, ref).item() == pytest.approx(0.193147, abs=1e-6)
    # old ln 0.5: ratio 1/0.5 = 2 (at the clamp) -> 0.386294; old ln 4: ratio 0.25 -> 0.048287
    assert kl_corrected_k3(lp, ref, old_logprob=t([math.log(0.5)])).item() == pytest.approx(
        0.386294, abs=1e-6
    )
    assert kl_corrected_k3(lp, ref, old_logprob=t([math.log(4.0)])).item() == pytest.approx(
        0.048287, abs=1e-6
    )
    # old ln 0.25: ratio 4 clamped to 2
    assert kl_corrected_k3(lp, ref, old_logprob=t([math.log(0.25)])).item() == pytest.approx(
        0.386294, abs=1e-6
    )
    # as a loss term the builder passes old_logprob: kl_coef 0.5 * 0.386294
    term = KLTerm(name="corrected_k3", estimator=kl_corrected_k3, kl_coef=0.5)
    loss, m = term.loss(lp, ref, t([1.0]), "token-mean", old_logprob=t([math.log(0.5)]))
    assert loss.item() == pytest.approx(0.193147, abs=1e-6) and m["kl_loss"] == pytest.approx(
        0.386294, abs=1e-6
    )
