"""The in-process checks: the device itself, bf16 autocast with fp32 master weights, FSDP2 on one rank,
checkpoint sync trainer → rollout model, and the step's per-phase memory figures.

Each takes the Context (lab.py) and returns its figures, or raises CheckFailed with what it measured.
Tolerances are loose enough for bf16 and tight enough to catch a wrong path (a loss off by a factor,
weights that did not move, a cast that lost the fp32 master copy).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch

from scripts.gpu_check import lab
from scripts.gpu_check.report import CheckFailed, CheckSkipped

MIB = 1024 * 1024
ADAMW_BYTES_PER_PARAM = 16  # fp32 weight + gradient + exp_avg + exp_avg_sq


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed_steps(engine: Any, experiences: list[Any], steps: int) -> tuple[list[float], float]:
    """(losses, median seconds per step) of `steps` steps on the same rows, after one warm-up step."""
    lab.step_losses(engine, experiences, 1)
    losses, times = [], []
    for _ in range(steps):
        _sync()
        t0 = time.perf_counter()
        losses += lab.step_losses(engine, experiences, 1)
        _sync()
        times.append(time.perf_counter() - t0)
    return losses, sorted(times)[len(times) // 2]


def check_device(ctx: lab.Context) -> Mapping[str, Any]:
    """The CUDA device answers and a bf16 matrix product agrees with its float64 reference."""
    figures = {k: v for k, v in lab.cuda_environment().items() if k != "cuda_available"}
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    ref = a.double() @ b.double()
    out = (a.bfloat16() @ b.bfloat16()).double()
    rel = float(torch.linalg.norm(out - ref) / torch.linalg.norm(ref))
    figures["bf16_matmul_rel_err"] = rel
    if not rel < 1e-2:  # bf16 operands land between 1e-3 and 1e-2; NaN fails too
        raise CheckFailed(f"bf16 matmul relative error {rel:.3g} (expected < 1e-2)", figures)
    return figures


def check_bf16(ctx: lab.Context) -> Mapping[str, Any]:
    """The trainer's forward runs under bf16 autocast (bf16 logits) while the weights, their gradients
    and the AdamW state stay float32; its loss tracks the fp32 engine's and falls on a fixed batch."""
    per_step, _, prompt, response = lab.sizes(ctx)
    bf16 = lab.make_engine(ctx, bf16=True, lr=5e-4)
    fp32 = lab.make_engine(ctx, bf16=False, lr=5e-4)
    experiences = lab.rows(per_step, prompt, response, seed=0)
    head = cast(Any, bf16.model).get_output_embeddings()
    seen: set[torch.dtype] = set()
    hook = head.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    try:
        first_bf16 = lab.step_losses(bf16, experiences, 1)[0]
    finally:
        hook.remove()
    first_fp32 = lab.step_losses(fp32, experiences, 1)[0]
    losses, step_s = _timed_steps(bf16, experiences, 4)
    _, fp32_step_s = _timed_steps(fp32, experiences, 2)
    params = list(bf16.model.parameters())
    state_dtypes = {
        v.dtype for p in params for v in bf16.optimizer.state[p].values() if torch.is_tensor(v) and v.ndim
    }
    figures: dict[str, Any] = {
        "logits_dtype": ",".join(sorted(str(d).removeprefix("torch.") for d in seen)),
        "weights_dtype": ",".join(sorted({str(p.dtype).removeprefix("torch.") for p in params})),
        "grads_dtype": ",".join(
            sorted({str(p.grad.dtype).removeprefix("torch.") for p in params if p.grad is not None})
        ),
        "adam_state_dtype": ",".join(sorted(str(d).removeprefix("torch.") for d in state_dtypes)),
        "loss_first_bf16": first_bf16,
        "loss_first_fp32": first_fp32,
        "loss_last_bf16": losses[-1],
        "step_ms_bf16": step_s * 1e3,
        "step_ms_fp32": fp32_step_s * 1e3,
    }
    rel = abs(first_bf16 - first_fp32) / abs(first_fp32)
    figures["loss_rel_diff"] = rel
    problems = []
    if seen != {torch.bfloat16}:
        problems.append(f"logits came out {figures['logits_dtype']}, not bfloat16 (autocast off?)")
    if {p.dtype for p in params} != {torch.float32} or figures["grads_dtype"] != "float32":
        problems.append("master weights or gradients are not float32")
    if state_dtypes != {torch.float32}:
        problems.append(f"AdamW state is {figures['adam_state_dtype']}, not float32")
    if not rel < 2e-2:
        problems.append(f"first loss bf16 {first_bf16:.4f} vs fp32 {first_fp32:.4f} (rel {rel:.3g} >= 2e-2)")
    if not losses[-1] < 0.98 * first_bf16:
        problems.append(f"loss did not fall on a fixed batch: {first_bf16:.4f} -> {losses[-1]:.4f}")
    if problems:
        raise CheckFailed("; ".join(problems), figures)
    return figures


@contextlib.contextmanager
def _one_rank_group() -> Iterator[Any]:
    """A torchrun-like environment of world size 1 and the trainer's own process group (nccl on a
    GPU, gloo on CPU: services/trainer/distributed.py), torn down afterwards."""
    import torch.distributed as dist

    from services.common.procs import free_port
    from services.trainer.distributed import init_distributed

    keys = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    try:
        yield init_distributed()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_fsdp(ctx: lab.Context) -> Mapping[str, Any]:
    """trainer.strategy fsdp2's engine on one rank (fully_shard, DTensor parameters, the gathered
    full state) trains as the one-process engine does: same losses, same weights after 3 steps."""
    import torch.distributed as dist

    per_step, _, prompt, response = lab.sizes(ctx)
    plain = lab.make_engine(ctx, bf16=True)
    experiences = lab.rows(per_step, prompt, response, seed=1)
    initial = {k: v.detach().cpu().clone() for k, v in plain.full_model_state().items()}
    plain_losses = lab.step_losses(plain, experiences, 3)
    with _one_rank_group() as group:
        sharded = lab.make_engine(ctx, bf16=True, dist=group)
        backend = dist.get_backend()
        param_type = type(next(sharded.model.parameters())).__name__
        sharded_losses = lab.step_losses(sharded, experiences, 3)
        full = sharded.full_model_state()  # a collective: every rank (here the only one) calls it
    final = {k: v.detach().cpu() for k, v in plain.full_model_state().items()}
    common = sorted(set(full) & set(final))
    # How far the sharded run's update strays from the plain one's, over every weight at once: AdamW
    # moves a near-zero gradient by ~lr either way, so single elements may differ by float noise.
    moved = math.sqrt(sum(float((final[k].float() - initial[k].float()).norm()) ** 2 for k in common))
    diff = math.sqrt(sum(float((full[k].float() - final[k].float()).norm()) ** 2 for k in common))
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(sharded_losses, plain_losses, strict=True))
    figures = {
        "backend": backend,
        "device": str(group.device),
        "param_type": param_type,
        "losses_fsdp": sharded_losses,
        "losses_single": plain_losses,
        "loss_max_rel_diff": loss_diff,
        "update_norm": moved,
        "update_rel_diff": diff / moved if moved else float("nan"),
    }
    problems = []
    if param_type != "DTensor":
        problems.append(f"parameters are {param_type}, not DTensor (fully_shard did not run)")
    if set(full) != set(final):
        problems.append(f"gathered names differ from the model's: {sorted(set(full) ^ set(final))[:4]}")
    tol = 1e-2 if ctx.cuda else 1e-5  # bf16 autocast on the GPU; float32 on CPU
    if not loss_diff < tol:
        problems.append(f"losses differ by {loss_diff:.3g} (rel) >= {tol}")
    update_tol = 0.05 if ctx.cuda else 1e-3
    if not (moved > 0 and diff <= update_tol * moved):
        problems.append(f"the weights' update differs by {diff:.3g} (norm) of {moved:.3g} (> {update_tol})")
    if problems:
        raise CheckFailed("; ".join(problems), figures)
    return figures


def check_sync(ctx: lab.Context) -> Mapping[str, Any]:
    """sync_method checkpoint from a trained engine to the rollout model, as the services do it: the
    trainer's full state written as a verified safetensors checkpoint (synchronizer/transfer/
    checkpoint.py), loaded, checksummed and copied into the explorer's model (bf16 on a GPU: dtype
    auto) by copy_into_module; every weight arrives, cast exactly, and the two score alike."""
    from services.explorer.engines.transformers_engine import sequence_logprobs
    from services.explorer.engines.weights import copy_into_module
    from services.models.loading import load_causal_lm
    from services.synchronizer.transfer.checkpoint import load_checkpoint, write_checkpoint

    per_step, _, prompt, response = lab.sizes(ctx)
    trainer = lab.make_engine(ctx, bf16=True, lr=5e-4)
    experiences = lab.rows(per_step, prompt, response, seed=2)
    lab.step_losses(trainer, experiences, 2)
    state = trainer.full_model_state()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    t0 = time.perf_counter()
    path, files = write_checkpoint(
        state, ctx.work / "sync", 2, config=cast(Any, trainer.model).config.to_dict()
    )
    write_s = time.perf_counter() - t0
    rollout = load_causal_lm(lab.MODEL, dtype="auto", device=ctx.device, seed=lab.SEED + 1)
    _sync()
    t0 = time.perf_counter()
    copied = copy_into_module(rollout, load_checkpoint(path, files).items())
    _sync()
    load_s = time.perf_counter() - t0
    targets = dict(rollout.named_parameters(remove_duplicate=False))
    mismatched = [
        n for n, p in targets.items() if not torch.equal(p.detach(), state[n].to(p.device, p.dtype))
    ]
    tokens = experiences[0].tokens.tolist()
    trainer.model.eval()
    got = sequence_logprobs(rollout, tokens, prompt)
    want = sequence_logprobs(trainer.model, tokens, prompt)
    lp_diff, lp_mean = float(abs(got - want).max()), float(abs(got - want).mean())
    figures = {
        "tensors": copied,
        "mb": nbytes / MIB,
        "write_s": write_s,
        "load_s": load_s,
        "rollout_dtype": str(next(rollout.parameters()).dtype).removeprefix("torch."),
        "mismatched": len(mismatched),
        "logprob_max_diff": lp_diff,
        "logprob_mean_diff": lp_mean,
    }
    problems = []
    if copied != len(state):
        problems.append(f"{copied} of {len(state)} tensors copied")
    if mismatched:
        problems.append(f"{len(mismatched)} weights differ from the trainer's, e.g. {mismatched[:3]}")
    low_precision = next(rollout.parameters()).dtype != torch.float32  # dtype auto: bf16 on a GPU
    max_tol, mean_tol = (0.5, 0.1) if low_precision else (1e-4, 1e-5)
    if not (lp_diff < max_tol and lp_mean < mean_tol):
        problems.append(
            f"rollout and trainer logprobs differ by max {lp_diff:.3g}, mean {lp_mean:.3g} (>= {max_tol}, {mean_tol})"
        )
    if problems:
        raise CheckFailed("; ".join(problems), figures)
    return figures


def check_memory(ctx: lab.Context) -> Mapping[str, Any]:
    """The step's memory/<phase>_peak_mb metrics (services/trainer/memory.py) exist and are plausible:
    the optimizer phase holds at least weights + gradients + both AdamW moments (16 bytes a parameter;
    CUDA allocator bytes on a GPU, the process's resident set on CPU), and no phase tops the step."""
    per_step, _, prompt, response = lab.sizes(ctx)
    engine = lab.make_engine(ctx, bf16=True)
    if not engine.peaks.available:
        raise CheckSkipped("no per-phase memory figures on this platform (memory.py: PhasePeaks.available)")
    experiences = lab.rows(per_step, prompt, response, seed=3)
    engine.train_step(lab.batch_of(experiences))  # the AdamW state exists from the first step on
    metrics = engine.train_step(lab.batch_of(experiences))
    figures: dict[str, Any] = {
        k.removeprefix("memory/"): v for k, v in metrics.items() if k.startswith("memory/")
    }
    floor = lab.parameter_count(engine.model) * ADAMW_BYTES_PER_PARAM / MIB
    figures["adamw_floor_mb"] = floor
    if ctx.cuda:  # what stays allocated after the step (weights, gradients, AdamW state) was there during it
        figures["cuda_allocated_after_mb"] = torch.cuda.memory_allocated() / MIB
        figures["cuda_reserved_mb"] = torch.cuda.memory_reserved() / MIB
    phases = ("forward", "backward", "optimizer", "step")
    missing = [p for p in phases if f"{p}_peak_mb" not in figures]
    if missing:
        raise CheckFailed(f"no memory/<phase>_peak_mb for {missing}", figures)
    problems = []
    step = figures["step_peak_mb"]
    if not figures["optimizer_peak_mb"] >= 0.95 * floor:
        problems.append(
            f"optimizer phase peak {figures['optimizer_peak_mb']:.0f} MiB < AdamW floor {floor:.0f}"
        )
    over = [p for p in phases if figures[f"{p}_peak_mb"] > step + 1.0]
    if over:
        problems.append(f"phases {over} peak above the whole step's {step:.0f} MiB")
    if ctx.cuda and not step >= figures["cuda_allocated_after_mb"] - 1.0:
        problems.append(f"the step's peak {step:.0f} MiB is below what is allocated after it")
    if problems:
        raise CheckFailed("; ".join(problems), figures)
    return figures
