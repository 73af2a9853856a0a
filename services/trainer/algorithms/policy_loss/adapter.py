"""Build a policy loss's batch form, fn(batch, logprob, **args), from its tensor function.

Each loss is written once, as a tensor function whose leading parameters are tensors named after
TrainBatch fields and whose keyword-only parameters are the loss's settings with Trinity-RFT's
defaults:

    def ppo_policy_loss(logprob, old_logprob, action_mask, advantages, *, clip_range_low=0.2, ...)
    ppo = batch_loss(ppo_policy_loss, name="ppo", extra_args=("clip_range",), prepare=clip_args)

The batch form fills the leading tensors from the batch and passes the config's args through, so
the defaults live on the tensor function only and cannot drift. Its reported signature is
(batch, logprob, *, <the tensor function's keyword args>, <extra_args>), which is what
`check_args` reads to reject an unknown arg. `extra_args` are the few config names that are not
the tensor function's own (Trinity's single `clip_range`, older aliases, accepted-and-unused
batch-size args); they carry no value of their own (default None) and `prepare` turns them into
the tensor function's args, explicitly, in the loss's module.

Two optional hooks ride on the batch form: `check(args)` validates the settings when the algorithm is
built (so `trinity config check` reports them), and `prepass(batch, logprob, args)` is run by the
engine once per optimizer step, over the whole batch, with the current policy's logprobs, before the
micro-batches (M2PO's batch-wide mask).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from services.algorithms.batch import TrainBatch
from services.trainer.algorithms.api import LossMetrics

LossOutput = tuple[Tensor, LossMetrics]
Prepare = Callable[[TrainBatch, dict[str, Any]], dict[str, Any]]

# tensor parameter name -> how the batch supplies it (a required field missing names itself)
BATCH_TENSORS: dict[str, Callable[[TrainBatch], Tensor]] = {
    "old_logprob": lambda batch: batch.require("old_logprob"),
    "action_mask": lambda batch: batch.action_mask,
    "advantages": lambda batch: batch.require("advantages"),
    "ref_logprob": lambda batch: batch.require("ref_logprob"),
    "is_expert": lambda batch: batch.require("is_expert").to(torch.bool),
    "model_version": lambda batch: batch.model_version,
    "m2po_mask": lambda batch: batch.require("m2po_mask"),
}
Prepass = Callable[[TrainBatch, Tensor, dict[str, Any]], dict[str, float]]


def batch_loss(
    tensor_fn: Callable[..., LossOutput],
    *,
    name: str,
    extra_args: Sequence[str] = (),
    prepare: Prepare | None = None,
    prepass: Prepass | None = None,
    check: Callable[..., None] | None = None,
) -> Callable[..., LossOutput]:
    """fn(batch, logprob, **args) -> tensor_fn(logprob, <batch tensors>..., **prepare(batch, args)).

    name: the registry name (also the function's __name__); prepare: checks the batch and maps
    `extra_args` onto the tensor function's args (it gets a copy of args it may change); prepass and
    check: the hooks of the module docstring (check gets every setting, defaults filled in).
    """
    params = list(inspect.signature(tensor_fn).parameters.values())
    leading = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    if not leading or leading[0] != "logprob" or not set(leading[1:]) <= set(BATCH_TENSORS):
        raise TypeError(
            f"{tensor_fn.__name__}: leading parameters must be logprob then batch tensors "
            f"({', '.join(BATCH_TENSORS)}), got {leading}"
        )
    settings = [p for p in params if p.kind is p.KEYWORD_ONLY]
    clash = sorted({p.name for p in settings} & set(extra_args))
    if clash:
        raise TypeError(f"{name}: extra_args {clash} are already {tensor_fn.__name__}'s own")
    tensors = [BATCH_TENSORS[field] for field in leading[1:]]

    def loss(batch: TrainBatch, logprob: Tensor, **args: Any) -> LossOutput:
        if prepare is not None:
            args = prepare(batch, args)
        return tensor_fn(logprob, *(get(batch) for get in tensors), **args)

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    keyword = inspect.Parameter.KEYWORD_ONLY
    signature = inspect.Signature(
        [
            inspect.Parameter("batch", positional, annotation=TrainBatch),
            inspect.Parameter("logprob", positional, annotation=Tensor),
            *settings,
            *(inspect.Parameter(arg, keyword, default=None) for arg in extra_args),
        ],
        return_annotation=LossOutput,
    )
    loss.__name__ = loss.__qualname__ = name
    loss.__module__ = tensor_fn.__module__
    loss.__doc__ = f"Policy loss `{name}`: {tensor_fn.__name__} over the batch's {', '.join(leading[1:])}."
    loss.__signature__ = signature  # type: ignore[attr-defined]
    loss.tensor_fn = tensor_fn  # type: ignore[attr-defined]
    loss.batch_tensors = tuple(leading[1:])  # type: ignore[attr-defined]
    loss.extra_args = tuple(extra_args)  # type: ignore[attr-defined]
    if prepass is not None:
        loss.prepass = prepass  # type: ignore[attr-defined]
    if check is not None:
        defaults = {p.name: p.default for p in settings}
        loss.check = lambda args: check(**{**defaults, **args})  # type: ignore[attr-defined]
    return loss
