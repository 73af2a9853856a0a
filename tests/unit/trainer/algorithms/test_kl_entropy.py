"""KL estimators, fixed/adaptive coefficient, KL as reward penalty and as loss, entropy term."""

from __future__ import annotations

import math

import pytest
import torch

from services.common.errors import InvalidArgument
from services.trainer.algorithms import entropy, kl
from services.trainer.algorithms.kl import KLTerm
from tests.fakes.tensors import close, make_batch, t

# d = logprob - ref = +0.5 and -0.5
LOGPROB = t([-1.0, -2.0])
REF = t([-1.5, -1.5])


def test_estimators():
    # k1 = d = [0.5, -0.5]; k2 = d^2/2 = [0.125, 0.125]; abs = [0.5, 0.5]
    # k3 = exp(-d) - 1 + d: exp(-0.5) - 0.5 = 0.106531 ; exp(0.5) - 1.5 = 0.148721
    assert close(kl.kl_k1(LOGPROB, REF), t([0.5, -0.5]))
    assert close(kl.kl_k2(LOGPROB, REF), t([0.125, 0.125]))
    assert close(kl.kl_abs(LOGPROB, REF), t([0.5, 0.5]))
    assert close(kl.kl_k3(LOGPROB, REF), t([0.106531, 0.148721]))
    assert close(kl.kl_low_var(LOGPROB, REF), t([0.106531, 0.148721]))
    assert close(kl.kl_none(LOGPROB, REF), torch.zeros(1, 2))


def test_low_var_kl_is_clamped():
    # d = 30: log r = -30 -> clamp -20 -> e^-20 + 20 - 1 = 19 -> clamp 10.  d = -30: e^20 - 21 -> clamp 10
    out = kl.kl_low_var(t([0.0, 0.0]), t([-30.0, 30.0]))
    assert close(out, t([10.0, 10.0]))
    assert math.isinf(kl.kl_k3(t([0.0]), t([100.0])).item())  # plain k3 is not clamped


def test_adaptive_coefficient():
    # coef 0.1, target 0.05, horizon 100, observed kl 0.1, batch 10:
    # error = clip(0.1 / 0.05 - 1 = 1, -0.2, 0.2) = 0.2 -> coef *= 1 + 0.2 * 10 / 100 = 1.02 -> 0.102
    term = KLTerm("k1", kl.kl_k1, kl_coef=0.1, adaptive=True, target_kl=0.05, horizon=100)
    term.update_coef(0.1, 10)
    assert term.kl_coef == pytest.approx(0.102)
    # below target: 0.04 / 0.05 - 1 = -0.2 -> coef *= 1 - 0.02 = 0.98 -> 0.09996
    term.update_coef(0.04, 10)
    assert term.kl_coef == pytest.approx(0.102 * 0.98)
    fixed = KLTerm("k1", kl.kl_k1, kl_coef=0.1)
    fixed.update_coef(10.0, 10)
    assert fixed.kl_coef == 0.1


def test_adaptive_needs_target_and_horizon():
    with pytest.raises(InvalidArgument):
        KLTerm("k1", kl.kl_k1, adaptive=True, target_kl=0.1)


def test_kl_as_reward_penalty():
    # scores [0, 1] (reward on the last token), old logprob [-1, -1], ref [-1.5, -1.2] -> k1 = [0.5, 0.2]
    # coef 0.1 -> token_level_rewards = [0 - 0.05, 1 - 0.02] = [-0.05, 0.98]; kl metric = mean(0.5, 0.2) = 0.35
    term = KLTerm("k1", kl.kl_k1, kl_coef=0.1)
    rewards, m = term.apply_penalty(t([0.0, 1.0]), t([-1.0, -1.0]), t([-1.5, -1.2]), torch.ones(1, 2))
    assert close(rewards, t([-0.05, 0.98]))
    assert m == {"kl": pytest.approx(0.35), "kl_coef": 0.1}
    none = KLTerm("none", kl.kl_none)
    same, m = none.apply_penalty(t([0.0, 1.0]), t([-1.0, -1.0]), None, torch.ones(1, 2))
    assert torch.equal(same, t([0.0, 1.0])) and m == {}


def test_kl_as_loss_scaled_by_coef():
    # k2 of d = [0.5, -0.5] = [0.125, 0.125]; token-mean 0.125; default coef 0.001 -> term 0.000125
    term = KLTerm("k2", kl.kl_k2)
    value, m = term.loss(LOGPROB, REF, torch.ones(1, 2), "token-mean")
    assert value.item() == pytest.approx(0.000125)
    assert m == {"kl_loss": pytest.approx(0.125), "kl_coef": 0.001}
    with pytest.raises(InvalidArgument):
        term.loss(LOGPROB, None, torch.ones(1, 2), "token-mean")


def test_entropy_default_mix_none():
    # entropy [[1, 2], [3, pad]], mask [[1, 1], [1, 0]]: token mean (1 + 2 + 3) / 3 = 2; coef 0.01 -> 0.02
    ent = t([1.0, 2.0], [3.0, 99.0])
    batch = make_batch(2, 2, action_mask=t([1, 1], [1, 0]), is_expert=torch.tensor([False, True]))
    term, m = entropy.default(batch, ent, entropy_coef=0.01)
    assert term.item() == pytest.approx(0.02) and m["entropy_loss"] == pytest.approx(2.0)
    # mix: only the non-expert row: (1 + 2) / 2 = 1.5
    term, m = entropy.mix(batch, ent, entropy_coef=0.01)
    assert term.item() == pytest.approx(0.015) and m["entropy_loss"] == pytest.approx(1.5)
    assert entropy.none(batch, ent) == (0.0, {})
