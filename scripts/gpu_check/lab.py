"""What the trainer checks share: where they run (Context), a fixed batch and a TrainEngine built as
the trainer service builds one (the `sft` algorithm of the library, AdamW, clip, the step's metrics).

The model is `builtin:tiny-30m` (GPT-2, 9 layers, hidden 512, ~29 M parameters, built locally): big
enough that the GPU does the work, small enough for a 2-core CPU run of every check.
"""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from services.common.config.algorithm import AlgorithmConfig
from services.common.experience import Experience
from services.models.loading import build_builtin
from services.trainer.algorithms import build_algorithm
from services.trainer.batching import Batch, build_batch
from services.trainer.distributed import DistContext
from services.trainer.engine import TrainEngine
from services.trainer.settings import EngineSettings

MODEL = "builtin:tiny-30m"
SEED = 1
FIRST_ID, ALPHABET = 4, 8  # token ids 4..11: past the builtin tokenizer's special tokens


@dataclass(frozen=True)
class Context:
    """Where the checks run: `device` is "cuda" or "cpu"; scratch files go under `work`."""

    device: str
    work: pathlib.Path
    repo: pathlib.Path
    python: str  # the interpreter for subprocesses (the demo's services, the benchmark)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def rows(n: int, prompt_len: int, response_len: int, seed: int) -> list[Experience]:
    """`n` rows of tokens drawn (fixed by `seed`) from ALPHABET ids, each `prompt_len` + `response_len`
    long: a small alphabet, so a few steps visibly lower the loss (towards ln 8 from ~ln vocab)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tokens = rng.integers(FIRST_ID, FIRST_ID + ALPHABET, size=prompt_len + response_len).astype(np.int64)
        out.append(Experience(tokens=tokens, prompt_length=prompt_len, model_version=0, reward=1.0))
    return out


def batch_of(experiences: list[Experience]) -> Batch:
    """A fresh Batch each call: a step fills its batch in place."""
    return build_batch(experiences, pad_token_id=0)


def sizes(ctx: Context) -> tuple[int, int, int, int]:
    """(rows per step, micro-batch size, prompt length, response length): GPU-sized on CUDA."""
    return (32, 8, 128, 256) if ctx.cuda else (4, 2, 16, 32)


def make_engine(
    ctx: Context, *, bf16: bool = True, lr: float = 1e-4, dist: DistContext | None = None
) -> TrainEngine:
    """A TrainEngine on tiny-30m (float32 weights from SEED) with the sft loss, on ctx.device."""
    model = build_builtin(MODEL, seed=SEED)
    _, micro, _, _ = sizes(ctx)
    settings = EngineSettings(micro_batch_size=micro, lr=lr, grad_clip=1.0, bf16=bf16)
    return TrainEngine(
        model, build_algorithm(AlgorithmConfig(algorithm_type="sft")), settings, device=ctx.device, dist=dist
    )


def step_losses(engine: TrainEngine, experiences: list[Experience], steps: int) -> list[float]:
    """Train `steps` steps on the same rows; each step's mean loss (actor/loss)."""
    losses = []
    for _ in range(steps):
        metrics = engine.train_step(batch_of(experiences))
        loss = float(metrics["actor/loss"])
        if not math.isfinite(loss):
            raise ValueError(f"non-finite loss {loss} at step {engine.step}")
        losses.append(loss)
    return losses


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def cuda_environment() -> dict[str, Any]:
    """torch's and the device's versions and names (device fields only where CUDA is available)."""
    env: dict[str, Any] = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            {
                "torch_cuda": torch.version.cuda,
                "device_name": props.name,
                "device_memory_gib": round(props.total_memory / 2**30, 1),
                "multiprocessors": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}",
                "bf16_supported": torch.cuda.is_bf16_supported(),
                "nccl_available": torch.distributed.is_nccl_available(),
            }
        )
    return env
