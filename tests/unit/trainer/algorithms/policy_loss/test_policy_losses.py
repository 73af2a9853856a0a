"""Policy losses against hand-derived numbers: values, metrics (Trinity-RFT names) and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from services.common.errors import InvalidArgument
from services.trainer.algorithms.policy_loss.cispo import cispo_policy_loss
from services.trainer.algorithms.policy_loss.dpo import dpo, dpo_loss
from services.trainer.algorithms.policy_loss.gspo import gspo, gspo_policy_loss
from services.trainer.algorithms.policy_loss.mix import mix_policy_loss
from services.trainer.algorithms.policy_loss.opmd import opmd_policy_loss
from services.trainer.algorithms.policy_loss.ppo import ppo, ppo_policy_loss
from services.trainer.algorithms.policy_loss.sft import sft_loss
from services.trainer.algorithms.value_loss import clipped_value_loss
from tests.fakes.tensors import close, make_batch, t


def _ppo_case():
    # log-ratios [0.3, -0.3, 1.5, -0.1], advantages [1, -1, -1, 2], clip 0.2, dual clip c = 3
    old = torch.zeros(1, 4)
    logprob = t([0.3, -0.3, 1.5, -0.1]).requires_grad_(True)
    return logprob, old, torch.ones(1, 4), t([1.0, -1.0, -1.0, 2.0])


def test_ppo_clip_and_dual_clip():
    # tok 1: ratio e^0.3 = 1.349859, A=1: L1 = -1.349859, L2 = -1.2 -> max -1.2 (clipped)
    # tok 2: ratio e^-0.3 = 0.740818, A=-1: L1 = 0.740818, L2 = 0.8 -> max 0.8 (clipped); L3 = 3 -> min 0.8
    # tok 3: ratio e^1.5 = 4.481689, A=-1: L1 = 4.481689, L2 = 1.2 -> max 4.481689; L3 = 3 -> 3 (dual clip)
    # tok 4: ratio e^-0.1 = 0.904837, A=2: L1 = L2 = -1.809675 (inside the range)
    # token-mean: (-1.2 + 0.8 + 3 - 1.809675) / 4 = 0.197581
    logprob, old, mask, adv = _ppo_case()
    loss, m = ppo_policy_loss(logprob, old, mask, adv)
    assert loss.item() == pytest.approx(0.197581, abs=1e-5)
    assert m["pg_loss"] == pytest.approx(0.197581, abs=1e-5)
    assert m["pg_clipfrac"] == pytest.approx(2 / 4)  # tokens 1, 2
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 4)  # token 3
    assert m["ppo_kl"] == pytest.approx(-(0.3 - 0.3 + 1.5 - 0.1) / 4)  # -0.35
    loss.backward()
    # clipped tokens have no gradient; token 4: d/dlogprob (-A * ratio) / 4 = -2 * 0.904837 / 4 = -0.452419
    assert close(logprob.grad, t([0.0, 0.0, 0.0, -0.452419]))


def test_ppo_asymmetric_clip_higher():
    # ratio e^0.25 = 1.284025, A = 1. Symmetric 0.2: clamp 1.2 -> -1.2. clip_range_high 0.28: clamp 1.28 -> -1.28
    logprob, old, mask, adv = t([0.25]), torch.zeros(1, 1), torch.ones(1, 1), t([1.0])
    sym, _ = ppo_policy_loss(logprob, old, mask, adv)
    asym, _ = ppo_policy_loss(logprob, old, mask, adv, clip_range_low=0.2, clip_range_high=0.28)
    assert sym.item() == pytest.approx(-1.2) and asym.item() == pytest.approx(-1.28)


def test_ppo_ignores_padding():
    # a masked token with a huge ratio and advantage must not change the loss: only tok 1 counts
    # ratio e^-0.1 = 0.904837, A = 1 -> -0.904837
    loss, m = ppo_policy_loss(t([-0.1, 5.0]), torch.zeros(1, 2), t([1.0, 0.0]), t([1.0, 100.0]))
    assert loss.item() == pytest.approx(-0.904837, abs=1e-5)
    assert m["pg_clipfrac"] == 0.0


def test_ppo_adapter_defaults_and_clip_resolution():
    # the adapter's default clip_range 0.2 == Trinity's; clip_range_low overrides only the low side
    batch = make_batch(1, 1, old_logprob=torch.zeros(1, 1), advantages=t([-1.0]))
    loss, _ = ppo(batch, t([-0.5]))  # ratio 0.606531 -> clamp 0.8 -> max(0.606531, 0.8) = 0.8
    assert loss.item() == pytest.approx(0.8)
    loss, _ = ppo(batch, t([-0.5]), clip_range_low=0.5)  # clamp to 0.5 -> max(0.606531, 0.5) = 0.606531
    assert loss.item() == pytest.approx(0.606531, abs=1e-5)
    with pytest.raises(InvalidArgument):
        ppo(batch, t([-0.5]), clip_range=None)
    with pytest.raises(InvalidArgument):
        ppo(batch, t([-0.5]), clip_ratio_c=1.0)


def test_gspo_sequence_ratio_clipped():
    # log-ratios [0.1, 0.3]: sequence ratio s = exp(mean) = e^0.2 = 1.221403; A = 1
    # Trinity defaults clip 3e-4/4e-4: clamp to 1.0004 -> max(-1.221403, -1.0004) = -1.0004 per token
    # seq-mean-token-mean: -1.0004; every token clipped; no gradient
    logprob = t([0.1, 0.3]).requires_grad_(True)
    loss, m = gspo_policy_loss(logprob, torch.zeros(1, 2), torch.ones(1, 2), t([1.0, 1.0]))
    assert loss.item() == pytest.approx(-1.0004, abs=1e-6)
    assert m["pg_clipfrac"] == 1.0
    assert m["ppo_kl"] == pytest.approx(-0.2) and m["ppo_kl_seq"] == pytest.approx(-0.2)
    loss.backward()
    assert close(logprob.grad, torch.zeros(1, 2))


def test_gspo_unclipped_gradient_flows_through_each_token():
    # clip_range 0.3: 1.221403 inside [0.7, 1.3] -> loss -1.221403; d/dlogprob_t = -A * s / 2 tokens = -0.610701
    batch = make_batch(1, 2, old_logprob=torch.zeros(1, 2), advantages=t([1.0, 1.0]))
    logprob = t([0.1, 0.3]).requires_grad_(True)
    loss, _ = gspo(batch, logprob, clip_range=0.3)
    assert loss.item() == pytest.approx(-1.221403, abs=1e-5)
    loss.backward()
    assert close(logprob.grad, t([-0.610701, -0.610701]))


def test_cispo_clipped_weight_without_token_mask_by_default():
    # log-ratios [0.5, -0.5, 0.1], A = [1, -1, 1], current logprob = old + ratio; old = [-1.5, -1.5, -0.6]
    # -> logprob [-1.0, -2.0, -0.5]. clip_range_low 1.0 (w >= 0), high 0.28 (w <= 1.28); no token mask
    # tok 1: ratio 1.648721 -> w = 1.28,     loss = -1 * 1.28 * (-1.0)          =  1.280000
    # tok 2: ratio 0.606531 -> w = 0.606531, loss = -(-1) * 0.606531 * (-2.0)   = -1.213061
    # tok 3: ratio 1.105171 -> w = 1.105171, loss = -1 * 1.105171 * (-0.5)      =  0.552585
    # token-mean = (1.28 - 1.213061 + 0.552585) / 3 = 0.206508; unmasked_frac 1
    old = t([-1.5, -1.5, -0.6])
    logprob = t([-1.0, -2.0, -0.5]).requires_grad_(True)
    loss, m = cispo_policy_loss(logprob, old, torch.ones(1, 3), t([1.0, -1.0, 1.0]))
    assert loss.item() == pytest.approx(0.206508, abs=1e-5)
    assert m["unmasked_frac"] == pytest.approx(1.0) and m["cispo_loss"] == pytest.approx(0.206508, abs=1e-5)
    assert m["ppo_kl"] == pytest.approx(-0.1 / 3, abs=1e-6)
    loss.backward()
    # the IS weight is a constant, so even the clipped token 1 keeps its gradient: -A * w / 3
    # -> [-1.28/3, 0.606531/3, -1.105171/3]
    assert close(logprob.grad, t([-0.426667, 0.202177, -0.368390]))


def test_cispo_token_mask_and_loss_agg_mode():
    # Same tokens with enable_mask_clip (ranges 1.0 / 0.28): token 1 (ratio 1.648721 > 1.28, A > 0) gets
    # m = 0 -> token-mean (0 - 1.213061 + 0.552585) / 3 = -0.220159; unmasked_frac 2/3
    old = t([-1.5, -1.5, -0.6])
    logprob = t([-1.0, -2.0, -0.5]).requires_grad_(True)
    adv, mask = t([1.0, -1.0, 1.0]), torch.ones(1, 3)
    loss, m = cispo_policy_loss(logprob, old, mask, adv, enable_mask_clip=True)
    assert loss.item() == pytest.approx(-0.220159, abs=1e-5)
    assert m["unmasked_frac"] == pytest.approx(2 / 3) and m["masked_frac"] == pytest.approx(2 / 3)
    loss.backward()
    # grad = -A * w * m / 3 -> [0, 0.606531/3, -1.105171/3]
    assert close(logprob.grad, t([0.0, 0.202177, -0.368390]))
    # a wider mask range (high 1.0: ratio must pass 2.0) keeps token 1: the unmasked value 0.206508
    loss, _ = cispo_policy_loss(logprob, old, mask, adv, enable_mask_clip=True, mask_clip_range_high=1.0)
    assert loss.item() == pytest.approx(0.206508, abs=1e-5)
    # seq-mean-token-sum of the one row: the sum 1.28 - 1.213061 + 0.552585 = 0.619524
    loss, _ = cispo_policy_loss(logprob, old, mask, adv, loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(0.619524, abs=1e-5)


def test_opmd_loss_scaled_by_tau():
    # -A * logprob = [-(1)(-1), -(-1)(-2)] = [1, -2], mean -0.5, / (1 + tau=1) = -0.25
    loss, m = opmd_policy_loss(t([-1.0, -2.0]), torch.ones(1, 2), t([1.0, -1.0]))
    assert loss.item() == pytest.approx(-0.25) and m["opmd_loss"] == pytest.approx(-0.25)


def test_sft_token_and_sequence_mean():
    # logprob [[-1, -2], [-3, pad]]: token mean (1 + 2 + 3) / 3 = 2; sequence mean (1.5 + 3) / 2 = 2.25
    logprob, mask = t([-1.0, -2.0], [-3.0, -50.0]), t([1, 1], [1, 0])
    assert sft_loss(logprob, mask)[0].item() == pytest.approx(2.0)
    assert sft_loss(logprob, mask, use_token_level_loss=False)[0].item() == pytest.approx(2.25)


def test_dpo_pair_loss_and_metrics():
    # chosen: sum(logprob - ref) = 2 * (-1 + 1.5) = 1.0; rejected: 2 * (-2 + 1.5) = -1.0; z = 2
    # beta 0.1: loss = -logsigmoid(0.2) = log(1 + e^-0.2) = 0.598139; rewards +-0.1; accuracy 1
    logprob = t([-1.0, -1.0], [-2.0, -2.0])
    ref = torch.full((2, 2), -1.5)
    loss, m = dpo_loss(logprob, ref, torch.ones(2, 2))
    assert loss.item() == pytest.approx(0.598139, abs=1e-5)
    assert m["chosen_reward"] == pytest.approx(0.1) and m["rejected_reward"] == pytest.approx(-0.1)
    assert m["accuracy_mean"] == 1.0 and m["dpo_loss"] == pytest.approx(0.598139, abs=1e-5)
    # label smoothing 0.1: 0.9 * 0.598139 + 0.1 * log(1 + e^0.2) = 0.538325 + 0.079814 = 0.618139
    smoothed, _ = dpo_loss(logprob, ref, torch.ones(2, 2), label_smoothing=0.1)
    assert smoothed.item() == pytest.approx(0.618139, abs=1e-5)


def test_dpo_rejects_odd_rows_and_broken_pairs():
    with pytest.raises(InvalidArgument):
        dpo_loss(torch.zeros(3, 1), torch.zeros(3, 1), torch.ones(3, 1))
    batch = make_batch(2, 1, ref_logprob=torch.zeros(2, 1), pair_index=torch.tensor([0, 1]))
    with pytest.raises(InvalidArgument) as err:
        dpo(batch, torch.zeros(2, 1))
    assert err.value.field == "batch.pair_index"


def test_mix_combines_ppo_on_usual_rows_and_sft_on_expert_rows():
    # usual row: ratio e^-0.1 = 0.904837, A = 1 -> pg -0.904837. expert row: logprob -2 -> sft 2
    # mu 0.1: 0.9 * -0.904837 + 0.1 * 2 = -0.814354 + 0.2 = -0.614354
    logprob = t([-1.0], [-2.0])
    old = t([-0.9], [0.0])
    loss, m = mix_policy_loss(logprob, old, torch.ones(2, 1), t([1.0], [0.0]), torch.tensor([False, True]))
    assert loss.item() == pytest.approx(-0.614354, abs=1e-5)
    assert m["usual/pg_loss"] == pytest.approx(-0.904837, abs=1e-5)
    assert m["expert/sft_loss"] == pytest.approx(2.0) and m["loss"] == pytest.approx(-0.614354, abs=1e-5)


def test_value_loss_clipped():
    # vpreds [1, 0], returns [2, 0.5], old values [0, 0], cliprange 0.5
    # tok 1: clipped pred 0.5 -> (1-2)^2 = 1 vs (0.5-2)^2 = 2.25 -> 2.25 (clip bites)
    # tok 2: 0.25 both. 0.5 * mean(2.25, 0.25) = 0.625
    loss, m = clipped_value_loss(t([1.0, 0.0]), t([2.0, 0.5]), torch.zeros(1, 2), torch.ones(1, 2))
    assert loss.item() == pytest.approx(0.625)
    assert m["vf_clipfrac"] == 0.5 and m["vpred_mean"] == 0.5


def test_log_ratio_is_clamped_against_overflow():
    # log-ratio 100 is clamped to 20 (Trinity): with A = -1 the dual clip caps the loss at 3, no inf/nan
    loss, _ = ppo_policy_loss(t([100.0]), torch.zeros(1, 1), torch.ones(1, 1), t([-1.0]))
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx(3.0)
