"""Multi-GPU training with torch FSDP2 under torchrun (trainer.strategy: fsdp2).

    torchrun --nproc_per_node 8 -m services.trainer --config run.yaml

Rank 0 is the service: it serves gRPC, reads and acks the buffer, publishes and writes checkpoints,
exactly as a one-process trainer does. The other ranks hold shards of the model and follow rank 0's
commands: every engine call that involves collectives (a train step, gathering the full weights or
the optimizer state) is first broadcast from rank 0 as (method, args) and then run by all ranks.

Data parallelism inside a step: the batch's length-bucketed micro-batches are dealt round-robin to
the ranks; a rank short of micro-batches runs a copy of one with loss scale 0, since FSDP's
all-gather / reduce-scatter need every rank to run the same number of forward/backward passes.
FSDP2 averages gradients over ranks, so each micro-batch loss is scaled by world_size × its share
of the rows, which makes the update equal to the one-process update. Work done once per batch
before the update (behaviour-logprob recomputation, reference logprobs, critic values) runs the
whole batch on every rank: simple and correct, at the cost of redundant compute on that phase.
The backend is nccl on GPUs and gloo on CPUs, so the same code is tested on CPU.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn, cast

import torch
from torch import nn

from services.common.errors import FailedPrecondition
from services.common.logging import get_logger

log = get_logger("trainer.distributed")


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistContext:
    """Join the torchrun group (env:// rendezvous); nccl on GPUs, gloo on CPUs."""
    import torch.distributed as dist

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise FailedPrecondition(
            "trainer.strategy fsdp2 runs under torchrun: torchrun --nproc_per_node N -m services.trainer --config F",
            field="trainer.strategy",
        )
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return DistContext(dist.get_rank(), dist.get_world_size(), device)


def shard(module: nn.Module) -> nn.Module:
    """fully_shard every transformer block (the model's `_no_split_modules` classes), then the root."""
    from torch.distributed.fsdp import fully_shard

    block_names = set(getattr(module, "_no_split_modules", None) or [])
    for sub in list(module.modules()):
        if sub is not module and type(sub).__name__ in block_names:
            fully_shard(sub)
    fully_shard(module)
    return module


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The sharded model's full weights, gathered to rank 0's CPU (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # full_state_dict=True gives plain tensors (ValueType also admits DTensor and nested dicts)
    return cast("dict[str, torch.Tensor]", get_model_state_dict(model, options=options))


def gather_training_state(
    trainables: nn.Module, optimizer: torch.optim.Optimizer, critic: nn.Module | None
) -> dict[str, Any]:
    """{"optimizer": full state keyed by parameter name[, "critic": its full weights]} on rank 0's
    CPU (a collective), so a checkpoint resumes under any world size of the same strategy."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, Any] = {"optimizer": get_optimizer_state_dict(trainables, optimizer, options=options)}
    if critic is not None:
        state["critic"] = get_model_state_dict(critic, options=options)
    return state


def scatter_training_state(
    trainables: nn.Module, optimizer: torch.optim.Optimizer, critic: nn.Module | None, state: dict[str, Any]
) -> None:
    """Load gather_training_state's full state into the shards (every rank passes it whole)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    if critic is not None and "critic" in state:
        set_model_state_dict(critic, state["critic"], options=options)
    set_optimizer_state_dict(trainables, optimizer, state["optimizer"], options=options)


def deal_micro_batches(chunks: list[Any], rank: int, world_size: int) -> list[tuple[Any, bool]]:
    """This rank's micro-batches as (indices, real): round-robin, padded with (chunks[0], False) dummies."""
    mine = [(chunks[i], True) for i in range(rank, len(chunks), world_size)]
    rounds = -(-len(chunks) // world_size)
    return mine + [(chunks[0], False)] * (rounds - len(mine))


def all_reduce_sums(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Sum a metrics dict over ranks (every rank must pass the same keys)."""
    import torch.distributed as dist

    keys = sorted(values)
    packed = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(packed)
    return dict(zip(keys, packed.tolist(), strict=True))


def broadcast(obj: Any, ctx: DistContext) -> Any:
    """Rank 0's `obj` on every rank (pickled; used for commands and batches)."""
    import torch.distributed as dist

    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0, device=ctx.device if ctx.device.type == "cuda" else None)
    return box[0]


_COLLECTIVE = ("train_step", "full_model_state", "state_dict")


class LeaderEngine:
    """Rank 0's view of the engine: collective calls are announced to the followers first."""

    def __init__(self, engine: Any, ctx: DistContext) -> None:
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_ctx", ctx)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._engine, name, value)  # e.g. TrainerLoop moving `step` past lost updates

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._engine, name)
        if name not in _COLLECTIVE:
            return attr

        def call(*args: Any) -> Any:
            broadcast((name, args), self._ctx)
            return attr(*args)

        return call

    def shutdown(self) -> None:
        """Release the followers (they return from follow()), then leave the group with them."""
        broadcast(("stop", ()), self._ctx)
        leave_group()


def leave_group() -> None:
    """Every rank, at the end: wait for the others, then destroy the process group. A rank that just
    exits while another still holds the group's connections can die in gloo's threads at interpreter
    exit (SIGABRT, "terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        log.info("process_group_left", rank=int(os.environ.get("RANK", "0")))


def exit_rank(code: int = 0) -> NoReturn:
    """End this torchrun rank now that it left the group, skipping interpreter finalization.

    destroy_process_group() does not free the gloo group while FSDP2's device mesh still holds
    it; it is then destroyed among the interpreter's last objects, where a gloo thread can still be
    joinable and the rank dies with SIGABRT ("terminate called without an active exception") after
    a run that succeeded (seen once in CI, not reproduced in 8 runs here). Everything that matters is on disk by now
    (checkpoints, logs), so flush the streams and leave with `code`.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe to a dead parent
            pass
    os._exit(code)


def follow(engine: Any, ctx: DistContext) -> None:
    """Ranks > 0: run rank 0's collective engine calls until it says stop, then leave the group."""
    while True:
        name, args = broadcast(None, ctx)
        if name == "stop":
            leave_group()
            return
        if name not in _COLLECTIVE:
            raise FailedPrecondition(f"rank 0 sent an unknown command {name!r}")
        getattr(engine, name)(*args)
