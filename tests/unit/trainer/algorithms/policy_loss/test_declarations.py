"""Each policy loss is declared once: its tensor function holds the args and their defaults.

The batch form the registry hands out (fn(batch, logprob, **args)) is built from the tensor
function's signature, so what `check_args` accepts and the defaults a user gets cannot drift from
the function that does the maths.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from services.common.errors import InvalidArgument
from services.common.registry import check_args
from services.trainer.algorithms.parts import POLICY_LOSS_FN
from services.trainer.algorithms.policy_loss.adapter import BATCH_TENSORS, batch_loss
from tests.fakes.tensors import make_batch, t

LOSSES = POLICY_LOSS_FN.builtin_names()


def keyword_params(fn: object, skip: int) -> dict[str, object]:
    params = list(inspect.signature(fn).parameters.values())[skip:]  # type: ignore[arg-type]
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}


@pytest.mark.parametrize("name", LOSSES)
def test_args_and_defaults_come_from_the_tensor_function(name):
    loss = POLICY_LOSS_FN.get(name)
    tensor_fn = loss.tensor_fn
    own = keyword_params(tensor_fn, skip=0)
    reported = keyword_params(loss, skip=2)
    # every setting of the tensor function, with its default, and nothing else but the extra names
    assert {k: v for k, v in reported.items() if k in own} == own
    extras = {k: v for k, v in reported.items() if k not in own}
    assert set(extras) == set(loss.extra_args)
    assert all(default is None for default in extras.values())  # an alias carries no value of its own
    # the leading tensors are filled from the batch
    leading = [
        p.name for p in inspect.signature(tensor_fn).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    assert leading[0] == "logprob" and set(leading[1:]) <= set(BATCH_TENSORS)
    assert loss.__module__ == tensor_fn.__module__ and loss.__name__ == name


@pytest.mark.parametrize("name", LOSSES)
def test_unknown_args_are_rejected_naming_the_real_ones(name):
    loss = POLICY_LOSS_FN.get(name)
    with pytest.raises(InvalidArgument) as err:
        check_args(loss, {"clip_rnage": 0.3}, "algorithm.policy_loss_fn_args", skip=2)
    allowed = sorted(keyword_params(loss, skip=2))
    assert err.value.message == f"unknown argument(s) ['clip_rnage']; allowed: {allowed}"


def test_the_batch_form_passes_batch_tensors_and_args_through():
    seen = {}

    def scaled_loss(logprob, action_mask, advantages, *, scale: float = 2.0):
        seen.update(scale=scale)
        return (-(advantages * logprob * action_mask).sum() * scale), {}

    loss_fn = batch_loss(scaled_loss, name="scaled")
    batch = make_batch(1, 2, advantages=t([1.0, 3.0]), action_mask=t([1.0, 0.0]))
    # -(1 * -0.5 * 1 + 3 * -1 * 0) * 2 = 1.0 with the tensor function's default scale
    assert loss_fn(batch, t([-0.5, -1.0]))[0].item() == pytest.approx(1.0)
    assert loss_fn(batch, t([-0.5, -1.0]), scale=4.0)[0].item() == pytest.approx(2.0)
    assert seen == {"scale": 4.0}
    with pytest.raises(InvalidArgument, match="batch.advantages"):
        loss_fn(make_batch(1, 2), t([-0.5, -1.0]))


def test_a_tensor_function_must_lead_with_logprob_and_batch_fields():
    with pytest.raises(TypeError, match="leading parameters"):
        batch_loss(lambda old_logprob, logprob: (torch.zeros(()), {}), name="bad")
    with pytest.raises(TypeError, match="leading parameters"):
        batch_loss(lambda logprob, scores: (torch.zeros(()), {}), name="bad")
