"""The checks that run whole programs: the toy demo through `trinity run`, and benchmarks/trainer_step.py.
Colocate mode is listed as not implemented.

Both run as subprocesses of the same interpreter and PYTHONPATH as the check, so the services use the
same torch (the device image's on a lent GPU machine) and see the same CUDA device.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from typing import Any

import yaml

from scripts.gpu_check import lab
from scripts.gpu_check.report import CheckFailed, CheckSkipped

SFT_STEPS = 250  # the embedded demo's SFT stage, shortened as tests/integration/test_e2e_run.py does
GRPO_STEPS = 60
# (GPU, CPU) limits: on the GPU the whole check must end within 8 minutes; a shared 2-core CPU is slower
DEMO_TIMEOUT_S = {"cuda": 270, "cpu": 900}
BENCH_TIMEOUT_S = {"cuda": 120, "cpu": 600}
ACCURACY = "eval/eval/accuracy/mean@1"
MIN_GAIN = 0.05  # held-out accuracy must rise at least this much from the untrained model's


def _env(ctx: lab.Context) -> dict[str, str]:
    """The check's environment with the repository and its generated stubs first on PYTHONPATH."""
    paths = [str(ctx.repo), str(ctx.repo / "gen"), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    return {**os.environ, "PYTHONPATH": ":".join(dict.fromkeys(paths)), "PYTHONUNBUFFERED": "1"}


def _run(cmd: list[str], ctx: lab.Context, log: pathlib.Path, timeout: float, what: str) -> int:
    """Run `cmd` (output to `log`) in its own process group, killed whole (the services a run
    started included) when it outlives `timeout`; its exit code."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=ctx.work, env=_env(ctx), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # trinity run stops the services it started
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise CheckFailed(
                f"{what} ran past {timeout:.0f} s: {_tail(log, 5)}", {"timeout_s": timeout}
            ) from None


def _tail(path: pathlib.Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return " | ".join(line.strip()[:200] for line in text[-lines:])


def demo_config(default_yaml: str, root: pathlib.Path) -> tuple[dict[str, Any], list[str]]:
    """The embedded demo shortened to SFT_STEPS + GRPO_STEPS: (the config file's tree, the --set items).

    The SFT stage's step count sits in a list entry (stages[0]), which `--set` cannot reach (OmegaConf
    merges a dotlist into a list as a mapping and refuses), so that one change goes into the file;
    everything else is a --set, as a user would shorten the demo."""
    tree = yaml.safe_load(default_yaml)
    tree["stages"][0]["buffer"]["total_steps"] = SFT_STEPS
    overrides = [
        f"checkpoint_root_dir={root}",
        f"buffer.total_steps={GRPO_STEPS}",
        "explorer.eval_interval=1000",  # scored before and after each stage only
        # the device image's tensorboard is built for its own protobuf, older than the stubs need
        "monitor.monitor_type=none",
        *(f"services.{svc}.port=0" for svc in ("buffer", "synchronizer", "trainer", "explorer")),
    ]
    return tree, overrides


def devices_in_logs(run_dir: pathlib.Path) -> dict[str, list[str]]:
    """{"trainer": [...], "rollout": [...]}: the devices the services reported building on
    (events trainer_engine_built and rollout_engine_built in <stage>/logs/*.log)."""
    seen: dict[str, set[str]] = {"trainer": set(), "rollout": set()}
    for log in sorted(run_dir.glob("*/logs/*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            event = record.get("event")
            if event in ("trainer_engine_built", "rollout_engine_built"):
                seen[event.split("_", 1)[0]].add(str(record.get("device", "?")).split(":")[0])
    return {k: sorted(v) for k, v in seen.items()}


def check_demo(ctx: lab.Context) -> Mapping[str, Any]:
    """`trinity run` of the embedded demo (SFT then GRPO on 3-digit addition, builtin:tiny-arith),
    shortened; the trainer and the rollout engine build on ctx.device (they pick CUDA whenever torch
    sees it: services/trainer/build.py, services/explorer/build.py) and held-out accuracy rises."""
    from services.common.config.loader import default_config_path

    work = ctx.work / "demo"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tree, overrides = demo_config(pathlib.Path(default_config_path()).read_text(), work / "runs")
    config = work / "demo.yaml"
    config.write_text(yaml.safe_dump(tree, sort_keys=False))
    cmd = [ctx.python, "-m", "services.cli.main", "run", "--config", str(config)]
    cmd += [a for o in overrides for a in ("--set", o)]
    log = work / "run.log"
    t0 = time.perf_counter()
    code = _run(cmd, ctx, log, DEMO_TIMEOUT_S[ctx.device], "trinity run")
    wall = time.perf_counter() - t0
    if code != 0:
        raise CheckFailed(f"trinity run exited {code}: {_tail(log)}", {"wall_s": wall})
    run_dir = work / "runs" / "trinity-grpc" / "demo"
    stages = json.loads((run_dir / "summary.json").read_text())["stages"]
    sft, grpo = stages
    start = float(sft["eval"]["start"][ACCURACY])
    after_sft, after_grpo = float(sft["eval"]["end"][ACCURACY]), float(grpo["eval"]["end"][ACCURACY])
    devices = devices_in_logs(run_dir)
    figures: dict[str, Any] = {
        "wall_s": wall,
        "sft_steps": sft["steps"],
        "grpo_steps": grpo["steps"],
        "accuracy_start": start,
        "accuracy_after_sft": after_sft,
        "accuracy_after_grpo": after_grpo,
        "trainer_device": ",".join(devices["trainer"]),
        "rollout_device": ",".join(devices["rollout"]),
    }
    problems = []
    if (sft["steps"], grpo["steps"]) != (SFT_STEPS, GRPO_STEPS):
        problems.append(f"ran {sft['steps']} + {grpo['steps']} steps, not {SFT_STEPS} + {GRPO_STEPS}")
    if not after_sft > start:
        problems.append(f"held-out accuracy did not rise under SFT: {start:.3f} -> {after_sft:.3f}")
    if not after_grpo >= start + MIN_GAIN:
        problems.append(f"held-out accuracy {start:.3f} -> {after_grpo:.3f}: no gain of {MIN_GAIN}")
    for role in ("trainer", "rollout"):
        if devices[role] != [ctx.device]:
            problems.append(
                f"the {role} built on {devices[role] or 'an unreported device'}, not {ctx.device}"
            )
    if problems:
        raise CheckFailed("; ".join(problems), figures)
    return figures


def check_bench(ctx: lab.Context) -> Mapping[str, Any]:
    """benchmarks/trainer_step.py on ctx.device (GPU-sized batches on CUDA, --quick on CPU): our
    step's tokens/s against the bare torch loop's on the same rows. PASS when both ran and the
    figures are sane; below the benchmark's target ratio is reported, not failed (a speed figure)."""
    out = ctx.work / "trainer_step.json"
    out.unlink(missing_ok=True)
    cmd = [ctx.python, str(ctx.repo / "benchmarks" / "trainer_step.py"), "--device", ctx.device]
    cmd += ["--out", str(out)] + ([] if ctx.cuda else ["--quick"])
    log = ctx.work / "trainer_step.log"
    code = _run(cmd, ctx, log, BENCH_TIMEOUT_S[ctx.device], "benchmarks/trainer_step.py")
    if code != 0 or not out.exists():
        raise CheckFailed(f"benchmarks/trainer_step.py exited {code}: {_tail(log)}")
    result = json.loads(out.read_text())
    figures = {
        "ours_tokens_s": result["ours"],
        "bare_tokens_s": result["baseline"],
        "ratio": result["ratio"],
        "target_ratio": result["target_ratio"],
        "device": result["config"]["device"],
        "rows_per_step": result["config"]["rows_per_step"],
    }
    if result["config"]["device"] != ctx.device:
        raise CheckFailed(f"the benchmark ran on {result['config']['device']}, not {ctx.device}", figures)
    if not (result["ours"] > 0 and result["baseline"] > 0):
        raise CheckFailed("a loop reported no throughput", figures)
    figures["meets_target"] = result["ratio"] >= result["target_ratio"]
    return figures


def check_colocate(ctx: lab.Context) -> Mapping[str, Any]:
    """mode: colocate shares the weights through host memory (docs/colocate.md): on CUDA the trainer
    refuses it at start, and on CPU tests/integration/test_colocate_run.py runs it."""
    raise CheckSkipped(
        "not implemented on CUDA: mode colocate shares the weights through host memory; CUDA IPC "
        "between the trainer's and the engine's processes is not built (docs/colocate.md)"
    )
