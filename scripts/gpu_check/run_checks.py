"""The checks that run whole programs: the toy demo and mode colocate through `trinity run`, and
benchmarks/trainer_step.py.

Both run as subprocesses of the same interpreter and PYTHONPATH as the check, so the services use the
same torch (the device image's on a lent GPU machine) and see the same CUDA device.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from scripts.gpu_check import lab
from scripts.gpu_check.report import CheckFailed

SFT_STEPS = 250  # the embedded demo's SFT stage, shortened as tests/integration/test_e2e_run.py does
GRPO_STEPS = 60
# (GPU, CPU) limits: on the GPU the whole check must end within 8 minutes; a shared 2-core CPU is slower
DEMO_TIMEOUT_S = {"cuda": 270, "cpu": 900}
BENCH_TIMEOUT_S = {"cuda": 120, "cpu": 600}
COLOCATE_TIMEOUT_S = {"cuda": 150, "cpu": 600}
COLOCATE_STEPS = 4
KL_TOL = 1e-4  # |actor/ppo_kl| of a step sampled from the trainer's own fp32 weights (1e-6 seen on CPU)
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


def trinity_run(
    ctx: lab.Context,
    name: str,
    make_config: Callable[[str, pathlib.Path], tuple[dict[str, Any], list[str]]],
    timeout: float,
) -> tuple[pathlib.Path, float]:
    """`trinity run` of `make_config(the embedded default's YAML, runs root)` in a fresh
    `<work>/<name>/` (the config's `name` must be `name`): (its run dir, wall seconds). A run that
    fails or outlives `timeout` fails the check with the end of its output."""
    from services.common.config.loader import default_config_path

    work = ctx.work / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tree, overrides = make_config(pathlib.Path(default_config_path()).read_text(), work / "runs")
    config = work / f"{name}.yaml"
    config.write_text(yaml.safe_dump(tree, sort_keys=False))
    cmd = [ctx.python, "-m", "services.cli.main", "run", "--config", str(config)]
    cmd += [a for o in overrides for a in ("--set", o)]
    log = work / "run.log"
    t0 = time.perf_counter()
    code = _run(cmd, ctx, log, timeout, f"trinity run ({name})")
    wall = time.perf_counter() - t0
    if code != 0:
        raise CheckFailed(f"trinity run exited {code}: {_tail(log)}", {"wall_s": wall})
    return work / "runs" / "trinity-grpc" / name, wall


def events(log: pathlib.Path, name: str) -> list[dict[str, Any]]:
    """The JSON log records of event `name` in `log` (none if the file is missing)."""
    found = []
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    for line in lines:
        if line.startswith("{") and f'"{name}"' in line:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("event") == name:
                    found.append(record)
    return found


def devices_in_logs(run_dir: pathlib.Path) -> dict[str, list[str]]:
    """{"trainer": [...], "rollout": [...]}: the devices the services reported building on
    (events trainer_engine_built and rollout_engine_built in <stage>/logs/*.log, or logs/*.log
    for a config without stages)."""
    seen: dict[str, set[str]] = {"trainer": set(), "rollout": set()}
    for log in sorted([*run_dir.glob("logs/*.log"), *run_dir.glob("*/logs/*.log")]):
        for role in seen:
            for record in events(log, f"{role}_engine_built"):
                seen[role].add(str(record.get("device", "?")).split(":")[0])
    return {k: sorted(v) for k, v in seen.items()}


def check_demo(ctx: lab.Context) -> Mapping[str, Any]:
    """`trinity run` of the embedded demo (SFT then GRPO on 3-digit addition, builtin:tiny-arith),
    shortened; the trainer and the rollout engine build on ctx.device (they pick CUDA whenever torch
    sees it: services/trainer/build.py, services/explorer/build.py) and held-out accuracy rises."""
    run_dir, wall = trinity_run(ctx, "demo", demo_config, DEMO_TIMEOUT_S[ctx.device])
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


def colocate_config(default_yaml: str, root: pathlib.Path) -> tuple[dict[str, Any], list[str]]:
    """The embedded demo's GRPO job in mode colocate, COLOCATE_STEPS steps: (the config file's tree,
    the --set items). No SFT stage and no eval tasksets (the untrained model scores 0, so groups are
    flat); an entropy bonus and a large learning rate move the shared weights far at every step, so
    an engine sampling from anything but the trainer's current weights shows in `actor/ppo_kl`.
    Both sides compute in fp32 (`trainer.bf16: false`, `dtype: float32`): the logprobs the engine
    sampled with then equal the trainer's to float rounding."""
    tree = yaml.safe_load(default_yaml)
    tree.pop("stages")
    tree["name"] = "colocate"
    tree["mode"] = "colocate"
    tree["model"]["dtype"] = "float32"
    tree["buffer"]["explorer_input"]["eval_tasksets"] = []
    tree["algorithm"].update(entropy_loss_fn="default", entropy_loss_fn_args={"entropy_coef": 0.5})
    tree["algorithm"]["optimizer"]["lr"] = 3e-2
    tree["synchronizer"] = {"sync_method": "memory", "sync_interval": 1, "sync_offset": 0}
    overrides = [
        f"checkpoint_root_dir={root}",
        f"buffer.total_steps={COLOCATE_STEPS}",
        "trainer.bf16=false",
        "monitor.monitor_type=none",
        *(f"services.{svc}.port=0" for svc in ("buffer", "synchronizer", "trainer", "explorer")),
    ]
    return tree, overrides


def check_colocate(ctx: lab.Context) -> Mapping[str, Any]:
    """`trinity run` in mode colocate (colocate_config): the trainer shares its parameters (on a GPU
    as CUDA IPC records of its own memory, on CPU as mapped files), the explorer's engine attaches to
    them once and never loads a checkpoint, and every step samples from the weights the trainer just
    made (`actor/ppo_kl` ~ 0 while each step moves them, staleness 0)."""
    run_dir, wall = trinity_run(ctx, "colocate", colocate_config, COLOCATE_TIMEOUT_S[ctx.device])
    stage = json.loads((run_dir / "summary.json").read_text())["stages"][0]
    logs = run_dir / "logs"
    shared = events(logs / "trainer.log", "weights_shared")
    attached = events(logs / "explorer.log", "weights_attached")
    progress = run_dir / "trainer" / "progress.jsonl"
    trained = [json.loads(line)["metrics"] for line in progress.read_text().splitlines() if line.strip()]
    kls = [abs(float(m["actor/ppo_kl"])) for m in trained]
    devices = devices_in_logs(run_dir)
    figures: dict[str, Any] = {
        "wall_s": wall,
        "steps": stage["steps"],
        "shared_device": shared[0].get("device") if shared else None,
        "attached_mib": attached[0].get("mib") if attached else None,
        "explorer_cuda_mib_before_attach": attached[0].get("cuda_allocated_mib_before") if attached else None,
        "explorer_cuda_mib_after_attach": attached[0].get("cuda_allocated_mib") if attached else None,
        "ppo_kl_max": max(kls, default=None),
        "grad_norm_min": min((float(m["actor/grad_norm"]) for m in trained), default=None),
        "trainer_step_peak_mb": max((float(m.get("memory/step_peak_mb", 0)) for m in trained), default=None),
        "trainer_device": ",".join(devices["trainer"]),
        "rollout_device": ",".join(devices["rollout"]),
    }
    problems = []
    if stage["status"] != "complete" or stage["steps"] != COLOCATE_STEPS:
        problems.append(f"the stage is {stage['status']} after {stage['steps']} of {COLOCATE_STEPS} steps")
    if len(shared) != 1 or len(attached) != 1:
        problems.append(f"weights shared {len(shared)} and attached {len(attached)} times, not once each")
    elif not str(shared[0].get("device", "")).startswith(ctx.device):
        problems.append(f"the trainer shared weights held on {shared[0].get('device')}, not {ctx.device}")
    elif shared[0]["directory"] != attached[0]["directory"]:
        problems.append("the explorer attached to another directory than the trainer shared")
    if events(logs / "explorer.log", "checkpoint_loaded"):
        problems.append("the explorer loaded a checkpoint")
    if len(kls) != COLOCATE_STEPS or not all(kl < KL_TOL for kl in kls):
        problems.append(f"ppo_kl per step {kls}: not all below {KL_TOL} (a stale or separate copy)")
    if not all(float(m["actor/grad_norm"]) > 0.01 for m in trained):
        problems.append("a step did not move the weights (grad_norm <= 0.01)")
    if any(float(m["staleness/max"]) != 0 for m in trained):
        problems.append("a step trained rows sampled from older weights (staleness > 0)")
    for role in ("trainer", "rollout"):
        if devices[role] != [ctx.device]:
            problems.append(
                f"the {role} built on {devices[role] or 'an unreported device'}, not {ctx.device}"
            )
    if shared and pathlib.Path(shared[0]["directory"]).exists():
        problems.append("the shared weights' directory outlived the run")
    if problems:
        raise CheckFailed("; ".join(problems), figures)
    return figures
