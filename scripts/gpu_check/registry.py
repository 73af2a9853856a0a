"""Every check, in the order they run: quick in-process ones first, the whole demo last.

Only `device` and `bf16` need CUDA (autocast is the GPU's: TrainEngine._autocast); the others run on
whatever device torch gives, so the script checks on a CPU machine as far as it goes.
"""

from __future__ import annotations

from scripts.gpu_check import run_checks, trainer_checks
from scripts.gpu_check.report import Check

CHECKS: tuple[Check, ...] = (
    Check(
        "device", "the CUDA device answers; a bf16 matmul matches float64", trainer_checks.check_device, True
    ),
    Check(
        "bf16",
        "bf16 autocast with fp32 master weights, gradients, AdamW state",
        trainer_checks.check_bf16,
        True,
    ),
    Check("memory", "memory/<phase>_peak_mb of a step, above the AdamW floor", trainer_checks.check_memory),
    Check("sync", "checkpoint sync trainer -> rollout model: exact weights", trainer_checks.check_sync),
    Check("fsdp", "FSDP2 on one rank equals the one-process engine", trainer_checks.check_fsdp),
    Check("bench", "benchmarks/trainer_step.py: ours vs the bare torch loop", run_checks.check_bench),
    Check("demo", "the embedded demo (shortened) through trinity run learns", run_checks.check_demo),
    Check(
        "colocate",
        "mode colocate: one copy of the weights, the engine samples the trainer's",
        run_checks.check_colocate,
    ),
)
