"""Are this machine's two cores two devices? A one-thread torch workload on core 0, alone and while
core 1 runs the same workload.

    .venv/bin/python benchmarks/core_overlap.py [--rounds 5] [--quick]

`benchmarks/smollm2_async.py --pin` stands the trainer on core 0 and the explorer on core 1 for two
devices. That holds only if work on one core does not slow the other: on a VM whose two vCPUs are
one physical core's two hardware threads, or that share a power or memory budget, overlapping
sampling with training also slows training, and no sync mode can win what the hardware takes back.

Workloads (one torch thread, pinned with `os.sched_setaffinity`): `matmul`, 1024 x 1024 fp32 matrix
products (compute-bound, as the trainer's and the engine's linear layers); `copy`, a 64 MiB tensor
copied (memory-bound). Each round times the workload on core 0 alone, then with core 1 running the
same workload for the whole measurement; rounds alternate so that drift from other processes falls
on both sides. Figure: the median time per operation on core 0 with core 1 busy; baseline: the
median alone; ratio 1.0 is what two devices would give. Last line: the JSON object of
benchmarks/README for `matmul` (both workloads' figures in its config).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import statistics
import time
from typing import Any

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def _operation(kind: str) -> Any:
    import torch

    torch.set_num_threads(1)
    if kind == "matmul":
        a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
        return lambda: a @ b
    src = torch.randn(16 * 1024 * 1024)  # 64 MiB of fp32: larger than the cache
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _timed(kind: str, core: int, ops: int) -> float:
    """Seconds per operation of `kind`, `ops` times on `core`, after a warm-up."""
    os.sched_setaffinity(0, {core})
    run = _operation(kind)
    for _ in range(3):
        run()
    start = time.perf_counter()
    for _ in range(ops):
        run()
    return (time.perf_counter() - start) / ops


def _busy(kind: str, core: int, stop: Any, ready: Any) -> None:
    os.sched_setaffinity(0, {core})
    run = _operation(kind)
    run()
    ready.set()
    while not stop.is_set():
        run()


def _with_neighbour(ctx: Any, kind: str, ops: int) -> float:
    stop, ready = ctx.Event(), ctx.Event()
    neighbour = ctx.Process(target=_busy, args=(kind, 1, stop, ready))
    neighbour.start()
    try:
        ready.wait(60)
        with ctx.Pool(1) as pool:
            return float(pool.apply(_timed, (kind, 0, ops)))
    finally:
        stop.set()
        neighbour.join(30)


def _alone(ctx: Any, kind: str, ops: int) -> float:
    with ctx.Pool(1) as pool:
        return float(pool.apply(_timed, (kind, 0, ops)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 rounds of fewer operations")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        raise SystemExit("core_overlap: needs cores 0 and 1 (os.sched_getaffinity)")
    rounds = 2 if args.quick else args.rounds
    ops = {"matmul": 20 if args.quick else 60, "copy": 10 if args.quick else 30}
    ctx = multiprocessing.get_context("spawn")
    figures: dict[str, dict[str, Any]] = {}
    for kind, n in ops.items():
        alone, shared = [], []
        for r in range(rounds):
            alone.append(_alone(ctx, kind, n))
            shared.append(_with_neighbour(ctx, kind, n))
            print(
                f"{kind} round {r + 1}: alone {alone[-1] * 1e3:.2f} ms, core 1 busy {shared[-1] * 1e3:.2f} ms",
                flush=True,
            )
        figures[kind] = {
            "alone_ms": round(statistics.median(alone) * 1e3, 3),
            "neighbour_busy_ms": round(statistics.median(shared) * 1e3, 3),
            "ratio": round(statistics.median(shared) / statistics.median(alone), 4),
            "rounds_ms": {
                "alone": [round(x * 1e3, 2) for x in alone],
                "busy": [round(x * 1e3, 2) for x in shared],
            },
        }
    main_fig = figures["matmul"]
    line = {
        "name": "core_overlap",
        "unit": "ms/matmul on core 0",
        "ours": main_fig["neighbour_busy_ms"],
        "baseline": main_fig["alone_ms"],
        "baseline_name": "the same matmul, core 1 not running it",
        "ratio": main_fig["ratio"],
        "target_ratio": 1.0,
        "lower_is_better": True,
        "config": {"rounds": rounds, "ops": ops, "workloads": figures, "cpu": _cpu_model()},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "core_overlap.json").write_text(json.dumps(line) + "\n")
    print(json.dumps(line))


def _cpu_model() -> str:
    try:
        for row in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
