"""Ulysses sequence parallelism (trainer.ulysses_sequence_parallel_size N) for the FSDP2 trainer.

DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509), the way veRL applies it to transformers
models: the W torchrun ranks form W / N groups of N consecutive ranks. The ranks of a group read the
same micro-batch, and each runs the model on its own 1/N of the positions (the sequence padded on
the right to a multiple of N): embeddings, MLPs, norms and the LM head see [b, L/N, ...] only. Around
attention, which needs every position, an all-to-all trades the sequence split for a head split:

    q, k, v [b, H, L/N, d]  --all-to-all-->  [b, H/N, L, d]  --attention-->  [b, L, H/N, d]
            --all-to-all-->  [b, L/N, H, d]

so each rank attends over the whole sequence for H/N heads. Position ids are the global ones (each
rank's slice of the full row), and the attention mask is built once for the full padded sequence
(the 4D mask the model itself would build) and handed to the model, which passes a 4D mask through
untouched. Grouped-query models need kv_heads divisible by N, or N divisible by kv_heads: then each
kv head is repeated N / kv_heads times before the exchange (veRL's rule).

The per-position logprobs (and values) of the ranks' shards are all-gathered into the full [b, L]
row; the backward of that gather keeps only the rank's own slice of the gradient, so each position's
gradient enters the model once in the group, and the all-to-alls' backward carries it across ranks.
The group's summed gradients are then the one-process micro-batch's, and FSDP's average over all W
ranks is undone by the same `world_size` loss factor as without sequence parallelism.

Supported: the model types in SUPPORTED (transformers' Llama/Qwen2/Qwen3 attention and GPT-2, the
builtin models' architecture), with sdpa or eager attention; anything else is refused naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.logging import get_logger

log = get_logger("trainer.ulysses")

KEY = "trainer.ulysses_sequence_parallel_size"
SUPPORTED = ("llama", "qwen2", "qwen3", "gpt2")
INNER_ATTENTION = ("sdpa", "eager")  # take a 4D mask; flash attention would need varlen lengths
PREFIX = "ulysses_"

# ---- shape maths (pure) -------------------------------------------------------------------------


def padded_length(length: int, size: int) -> int:
    """The sequence length rounded up to a multiple of the group size N."""
    return -(-length // size) * size


def shard_slice(length: int, size: int, rank: int) -> slice:
    """Columns of a row of `length` (a multiple of size) that rank `rank` of the group runs."""
    if length % size:
        raise ValueError(f"length {length} is not a multiple of the sequence-parallel size {size}")
    per = length // size
    return slice(rank * per, (rank + 1) * per)


def kv_repeats(kv_heads: int, size: int) -> int:
    """How often each key/value head is repeated so that the heads split evenly over `size` ranks."""
    if kv_heads % size == 0:
        return 1
    if size % kv_heads == 0:
        return size // kv_heads
    raise InvalidArgument(
        f"{KEY} {size}: the model's {kv_heads} key/value heads split neither into {size} groups nor "
        f"evenly repeat to {size}; pick a size that divides {kv_heads} or a multiple of it",
        field=KEY,
    )


def split_chunks(x: Tensor, dim: int, size: int) -> list[Tensor]:
    """x cut into `size` equal pieces along dim (what a rank sends, piece i to rank i)."""
    if x.shape[dim] % size:
        raise ValueError(f"dimension {dim} of shape {tuple(x.shape)} does not split into {size}")
    return list(x.chunk(size, dim=dim))


def join_chunks(pieces: list[Tensor], dim: int) -> Tensor:
    """The pieces a rank received (piece i from rank i) joined along dim."""
    return torch.cat(pieces, dim=dim)


# ---- collectives with autograd ------------------------------------------------------------------


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's place: its sequence-parallel group (size ranks, this one is `rank` in it) and its
    data-parallel coordinates (the group's index among world_size / size groups)."""

    size: int
    rank: int
    group: Any  # torch.distributed.ProcessGroup
    dp_rank: int
    dp_size: int


def all_to_all(x: Tensor, scatter_dim: int, gather_dim: int, sp: SequenceParallel) -> Tensor:
    """Piece i of x along scatter_dim goes to rank i; the pieces received are joined along gather_dim."""
    return _AllToAll.apply(x, scatter_dim, gather_dim, sp)


def _exchange(x: Tensor, scatter_dim: int, gather_dim: int, sp: SequenceParallel) -> Tensor:
    import torch.distributed as dist

    send = torch.stack(split_chunks(x, scatter_dim, sp.size)).contiguous()  # [N, *piece]
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=sp.group)  # gloo and nccl both have it
    return join_chunks(list(received.unbind(0)), gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, scatter_dim: int, gather_dim: int, sp: SequenceParallel) -> Tensor:
        ctx.dims, ctx.sp = (scatter_dim, gather_dim), sp
        return _exchange(x, scatter_dim, gather_dim, sp)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad, gather_dim, scatter_dim, ctx.sp), None, None, None


def gather_sequence(x: Tensor, sp: SequenceParallel) -> Tensor:
    """[b, L/N] shards of the group → the full [b, L] on every rank; backward: this rank's slice of
    the gradient (every rank computes the same loss from the full row, so each position counts once)."""
    return _GatherSequence.apply(x, sp)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, sp: SequenceParallel) -> Tensor:
        import torch.distributed as dist

        ctx.sp = sp
        pieces = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(pieces, x.contiguous(), group=sp.group)
        return torch.cat(pieces, dim=1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None]:
        sp = ctx.sp
        return grad[:, shard_slice(grad.shape[1], sp.size, sp.rank)].contiguous(), None


def new_sequence_parallel(rank: int, world_size: int, size: int) -> SequenceParallel:
    """Make the world_size / size groups of consecutive ranks (a collective: every rank calls it)."""
    import torch.distributed as dist

    if world_size % size:
        raise FailedPrecondition(
            f"{KEY} {size} does not divide the {world_size} torchrun ranks; start a multiple of {size}",
            field=KEY,
        )
    mine = None
    for first in range(0, world_size, size):
        group = dist.new_group(list(range(first, first + size)))  # every rank creates every group
        if first <= rank < first + size:
            mine = group
    return SequenceParallel(size, rank % size, mine, rank // size, world_size // size)


# ---- attention ----------------------------------------------------------------------------------

_ACTIVE: SequenceParallel | None = None  # one group per process; the attention function reads it


class _Heads:
    """The attention module as the inner attention function sees it, with the local head ratio."""

    def __init__(self, module: nn.Module, groups: int) -> None:
        self._module = module
        self.num_key_value_groups = groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _ulysses_attention(inner: str) -> Any:
    def attention(
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        **kwargs: Any,
    ) -> tuple[Tensor, None]:
        """query [b, H, L/N, d], key/value [b, KV, L/N, d] → output [b, L/N, H, d]."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        sp = _ACTIVE
        if sp is None:
            raise RuntimeError("Ulysses attention ran outside a sequence-parallel trainer (no group set)")
        full = query.shape[2] * sp.size
        if attention_mask is None or attention_mask.shape[-1] != full:
            raise RuntimeError(
                f"Ulysses attention needs the full-sequence mask of {full} positions; run the model "
                "through services.trainer.ulysses (ShardedInputs)"
            )
        repeats = kv_repeats(key.shape[1], sp.size)
        if repeats > 1:
            key, value = key.repeat_interleave(repeats, dim=1), value.repeat_interleave(repeats, dim=1)
        q, k, v = (all_to_all(t, 1, 2, sp) for t in (query, key, value))  # [b, heads/N, L, d]
        out, _ = ALL_ATTENTION_FUNCTIONS[inner](
            _Heads(module, q.shape[1] // k.shape[1]), q, k, v, attention_mask, **kwargs
        )
        return all_to_all(out, 1, 2, sp), None  # [b, L, H/N, d] → [b, L/N, H, d]

    return attention


def _register(inner: str) -> str:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    name = PREFIX + inner
    AttentionInterface.register(name, _ulysses_attention(inner))
    # the full-sequence mask is built with the inner implementation's own mask function
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[inner])
    return name


def check_model(model: nn.Module, size: int) -> None:
    """Refuse, naming the key, a model Ulysses cannot split: its type, heads or attention."""
    config: Any = model.config
    kind = getattr(config, "model_type", type(model).__name__)
    if kind not in SUPPORTED:
        raise InvalidArgument(
            f"{KEY} {size}: model type {kind!r} (model.model_path) is not supported by sequence "
            f"parallelism here; supported: {', '.join(SUPPORTED)}; set {KEY}: 1",
            field=KEY,
        )
    heads = int(config.num_attention_heads)
    if heads % size:
        raise InvalidArgument(f"{KEY} {size} does not divide the model's {heads} attention heads", field=KEY)
    kv_repeats(int(getattr(config, "num_key_value_heads", None) or heads), size)
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or getattr(config, "use_sliding_window", False):
        raise InvalidArgument(
            f"{KEY} {size}: sliding-window attention layers ({sorted(layer_types)}) are not supported",
            field=KEY,
        )
    inner = str(config._attn_implementation).removeprefix(PREFIX)
    if inner not in INNER_ATTENTION:
        raise InvalidArgument(
            f"{KEY} {size}: attention implementation {inner!r} is not supported; "
            f"one of {', '.join(INNER_ATTENTION)}",
            field=KEY,
        )


def enable(model: nn.Module, sp: SequenceParallel) -> None:
    """Route `model`'s attention through the all-to-all (after check_model); idempotent."""
    global _ACTIVE
    check_model(model, sp.size)
    config: Any = model.config
    inner = str(config._attn_implementation).removeprefix(PREFIX)
    config._attn_implementation = _register(inner)
    _ACTIVE = sp


def setup_sequence_parallel(dist_ctx: Any, size: int, *models: nn.Module | None) -> SequenceParallel | None:
    """The engine's Ulysses set-up: None at size 1; else check every model (before any collective,
    so every rank refuses alike), make the groups and route each model's attention. A critic
    (modeling.ValueModel) is checked and routed through its backbone and runs its forward sharded."""
    if size == 1:
        return None
    if dist_ctx is None:
        raise FailedPrecondition(
            f"{KEY} {size} needs trainer.strategy fsdp2, started with torchrun on a multiple of {size} ranks",
            field=KEY,
        )
    lms = [getattr(m, "backbone", m) for m in models if m is not None]
    for lm in lms:
        check_model(lm, size)
    sp = new_sequence_parallel(dist_ctx.rank, dist_ctx.world_size, size)
    for lm in lms:
        enable(lm, sp)
    for m in models:
        if m is not None and hasattr(m, "backbone"):
            cast(Any, m).sequence_parallel = sp  # a modeling.ValueModel
    log.info("sequence_parallel", size=size, group_rank=sp.rank, dp_rank=sp.dp_rank, dp_size=sp.dp_size)
    return sp
