"""The composite algorithm's rollout correction: once per batch with recomputed old logprobs (veRL's
decoupled mode), or per micro-batch against the policy being trained (bypass mode); by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from services.common.config import validate_config
from services.common.errors import InvalidArgument
from services.trainer.algorithms import build_algorithm
from tests.fakes.tensors import close, make_batch, t

LN2, LN3 = math.log(2.0), math.log(3.0)


def algo(**section: Any) -> Any:
    return build_algorithm(validate_config({"algorithm": {"algorithm_type": "grpo", **section}}).algorithm)


def test_decoupled_weights_scale_the_advantages_and_rejection_narrows_the_mask() -> None:
    a = algo(
        bypass_old_logprobs=False,
        kl_loss_fn="none",
        rollout_correction={
            "rollout_is": "token",
            "rollout_is_threshold": 1.5,
            "rollout_rs": "token_k3",
            "rollout_rs_threshold": 0.5,
        },
    )
    assert a.recompute_old_logprob
    # old (recomputed) vs rollout: log r = [ln2, 0, -ln2, ln3]: w = [1.5 (2 truncated), 1, 0.5, 1.5]
    # k3 = r - 1 - log r: [0.306853, 0, 0.193147, 0.901388]: the last token (> 0.5) is rejected
    batch = make_batch(1, 4, old_logprob=t([LN2, 0.0, -LN2, LN3]), advantages=t([1.0, 1.0, -2.0, 1.0]))
    batch.rollout_logprob = torch.zeros(1, 4)
    metrics = a.correct_batch(batch)
    assert close(batch.advantages, t([1.5, 1.0, -1.0, 1.5]))
    assert close(batch.action_mask, t([1.0, 1.0, 1.0, 0.0]))
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.25)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(3.0)


def test_bypass_mode_does_nothing_once_per_batch() -> None:
    a = algo(rollout_correction={"rollout_is": "token"})
    batch = make_batch(1, 2, advantages=t([1.0, 1.0]))
    assert not a.recompute_old_logprob and a.correct_batch(batch) == {}
    assert close(batch.advantages, t([1.0, 1.0]))


def test_bypass_rejection_drops_tokens_from_the_ppo_loss() -> None:
    # old = rollout = 0; current log r = [ln3, 0], A = 1. PPO per token: -min(r, 1.2) = [-1.2, -1].
    # token_k1 in [0.5, 2] rejects the r = 3 token: the token mean is over the other one, -1.
    plain = algo(kl_loss_fn="none", entropy_loss_fn="none")
    rs = algo(
        kl_loss_fn="none",
        entropy_loss_fn="none",
        rollout_correction={"rollout_is": "token", "rollout_rs": "token_k1", "rollout_rs_threshold": 2.0},
    )
    batch = make_batch(1, 2, advantages=t([1.0, 1.0]))
    loss, _ = plain.compute_loss(batch, t([LN3, 0.0]), None)
    assert loss.item() == pytest.approx(-1.1)
    loss, m = rs.compute_loss(batch, t([LN3, 0.0]), None)
    assert loss.item() == pytest.approx(-1.0)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)
    # ppo_clip: the IS weights (3 truncated to 2, and 1) are reported, not applied
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.5)
    assert close(batch.action_mask, torch.ones(1, 2))  # the batch itself is not changed


def test_bypass_reinforce_weights_the_log_likelihood() -> None:
    # loss_t = -A w logprob with w = r truncated at 2: logprob [ln 0.5, ln 0.25], old [ln 0.25, ln 0.25]
    # w = [2, 1]: -(2 ln 0.5 + 1 ln 0.25) / 2 = (1.386294 + 1.386294) / 2 = 1.386294
    a = algo(
        kl_loss_fn="none",
        entropy_loss_fn="none",
        rollout_correction={"rollout_is": "token", "loss_type": "reinforce"},
    )
    batch = make_batch(1, 2, old_logprob=t([math.log(0.25)] * 2), advantages=t([1.0, 1.0]))
    logprob = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    loss, m = a.compute_loss(batch, logprob, None)
    assert loss.item() == pytest.approx(2 * LN2)
    loss.backward()
    assert close(logprob.grad, t([-1.0, -0.5]))  # -A w / 2
    assert m["pg_loss"] == pytest.approx(2 * LN2)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"algorithm_type": "sft", "rollout_correction": {}}, "reads no behaviour logprobs"),
        (
            {
                "policy_loss_fn": "opmd",
                "bypass_old_logprobs": False,
                "rollout_correction": {"rollout_is": "token"},
            },
            "not for policy_loss_fn opmd",
        ),
        ({"policy_loss_fn": "gspo", "rollout_correction": {"loss_type": "reinforce"}}, "replaces the ppo"),
    ],
)
def test_corrections_a_loss_cannot_take_are_refused_at_build(section: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        algo(**section)
    # rejection alone needs no weighting: fine with any loss that reads old logprobs
    algo(policy_loss_fn="opmd", bypass_old_logprobs=False, rollout_correction={"rollout_is": None})
