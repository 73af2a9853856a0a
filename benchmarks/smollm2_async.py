"""What asynchrony buys on the real model: examples/smollm2_grpo's on-policy job against its one-step
off-policy (`offset1`) and fully asynchronous (`fully_async`) variants, seconds per step.

    .venv-vllm/bin/python benchmarks/smollm2_async.py [--steps 8] [--pin] [--variants offset1,fully_async]
    .venv-vllm/bin/python benchmarks/smollm2_async.py --pin --baseline dapo_first_wording --variants dapo_offset1,dapo_fully_async

Each variant is a `trinity run` of examples/smollm2_grpo/<variant>.yaml with vLLM rollouts, its
evals removed and the training file read in order (every run gets the same questions), one after
the other on this machine; the on-policy run (`--baseline`, config.yaml by default; DAPO's on-policy
job is dapo_first_wording.yaml) is the baseline of each figure, measured in the same invocation. `--pin` runs the trainer on core 0 and the explorer on core 1
(TRINITY_PIN_CPUS, `taskset -c`, one torch thread each): one device each on a 2-core box, so
sampling and training overlap only as far as separate devices would let them. Without it both use
every core and compete.

Figures per variant, from the trainer's and the explorer's progress files (steady state: the first
`--warmup` steps left out):
- s/step: (t_last - t_first) / (N - 1) over the trainer's step finish times;
- bound: the longer of the explorer's sampling per step (time/rollout_s) and the trainer's own work
  per step (time/step + time/publish): what a perfect overlap would take;
- trainer wait: the share of the trainer's wall time spent waiting for its batch (time/read);
- staleness: the mean and max versions between the weights that sampled a row and those that trained it.
Last lines: one JSON object (benchmarks/README.md) per variant, ratio = variant s/step / on-policy s/step.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.lib.e2e_figures import steady_step_time  # noqa: E402

EXAMPLE = ROOT / "examples" / "smollm2_grpo"
TARGETS = {"fully_async": 0.75, "dapo_fully_async": 0.75, "offset1": 1.0, "dapo_offset1": 1.0}


def say(message: str) -> None:
    print(f"[smollm2_async] {message}", file=sys.stderr, flush=True)


def records(path: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_variant(variant: str, model_dir: str, steps: int, work: pathlib.Path, pin: bool) -> pathlib.Path:
    """`trinity run` of one variant without evals, the training file in order; returns its run dir."""
    import yaml

    from services.tasks.chat_arith import write_tasksets

    write_tasksets(work / "smollm2_data")
    write_tasksets(work / "smollm2_data_first", "first")
    cfg = yaml.safe_load((EXAMPLE / f"{variant}.yaml").read_text())
    cfg["buffer"]["explorer_input"].pop("eval_tasksets")
    cfg["explorer"]["eval_on_startup"] = False
    cfg["buffer"]["explorer_input"]["taskset"]["task_selector"] = {"selector_type": "sequential"}
    cfg["monitor"] = {"monitor_type": "none"}
    config = work / f"{variant}.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {
        **os.environ,
        "SMOLLM2_STEPS": str(steps),
        "SMOLLM2_DIR": model_dir,
        "TRINITY_ENGINE": "vllm",
        "TRINITY_CHECKPOINT_ROOT_DIR": str(work),
    }
    if pin:
        env["TRINITY_PIN_CPUS"] = "trainer=0,explorer=1"
    trinity = pathlib.Path(sys.executable).parent / "trinity"
    subprocess.run([str(trinity), "run", "-c", str(config)], cwd=work, env=env, check=True, stdout=sys.stderr)
    name = cfg["name"].replace("${oc.env:SMOLLM2_SEED,0}", "0")
    return work / cfg["project"] / name


def figures(run_dir: pathlib.Path, warmup: int) -> dict[str, Any]:
    trainer = records(run_dir / "trainer" / "progress.jsonl")[warmup:]
    [explorer_file] = sorted((run_dir / "explorer").glob("progress-*.jsonl"))
    explorer = [r for r in records(explorer_file) if "metrics" in r][warmup:]
    tm = [r["metrics"] for r in trainer]
    wall = steady_step_time([float(r["time"]) for r in trainer])
    work = statistics.fmean(m.get("time/step", 0.0) + m.get("time/publish", 0.0) for m in tm)
    sampling = statistics.fmean(r["metrics"].get("time/rollout_s", 0.0) for r in explorer)
    read = sum(m.get("time/read", 0.0) for m in tm[1:])  # the first step's read is before t_first
    return {
        "s_per_step": round(wall, 2),
        "bound_s": round(max(work, sampling), 2),
        "sampling_s": round(sampling, 2),
        "trainer_work_s": round(work, 2),
        "trainer_wait_share": round(read / (wall * (len(tm) - 1)), 3) if len(tm) > 1 else None,
        "staleness_mean": round(statistics.fmean(m.get("staleness/mean", 0.0) for m in tm), 2),
        "staleness_max": max(m.get("staleness/max", 0.0) for m in tm),
        "reward_mean": [round(float(m["critic/rewards/mean"]), 3) for m in tm if "critic/rewards/mean" in m],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of every figure")
    parser.add_argument("--pin", action="store_true", help="trainer on core 0, explorer on core 1")
    parser.add_argument("--variants", default="offset1,fully_async")
    parser.add_argument("--baseline", default="config", help="the on-policy variant every ratio is to")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    for flag, names in (("--baseline", [args.baseline]), ("--variants", variants)):
        unknown = [v for v in names if not (EXAMPLE / f"{v}.yaml").exists()]
        if unknown:
            parser.error(f"{flag}: no examples/smollm2_grpo/{unknown[0]}.yaml")
    if args.steps < args.warmup + 3:
        parser.error(f"--steps must be at least --warmup + 3 = {args.warmup + 3}")
    if not pathlib.Path(args.model).exists():
        sys.exit(f"--model {args.model}: no model there; `make model-smollm2` converts SmolLM2 offline")
    got: dict[str, dict[str, Any]] = {}
    for variant in [args.baseline, *variants]:
        with tempfile.TemporaryDirectory(prefix=f"smollm2-async-{variant}-") as tmp:
            say(f"{variant}: trinity run, {args.steps} steps{' pinned' if args.pin else ''}")
            got[variant] = figures(
                run_variant(variant, args.model, args.steps, pathlib.Path(tmp), args.pin), args.warmup
            )
            say(f"{variant}: {json.dumps(got[variant])}")
    base = got[args.baseline]
    for variant in variants:
        mine = got[variant]
        line = {
            "name": f"smollm2_{variant}" + ("_pinned" if args.pin else ""),
            "unit": "s/step",
            "ours": mine["s_per_step"],
            "baseline": base["s_per_step"],
            "baseline_name": f"the on-policy run (examples/smollm2_grpo/{args.baseline}.yaml), same invocation",
            "ratio": round(mine["s_per_step"] / base["s_per_step"], 3),
            "target_ratio": TARGETS.get(variant, 1.0),
            "lower_is_better": True,
            "config": {
                "model": args.model,
                "steps": args.steps,
                "warmup": args.warmup,
                "pinned": args.pin,
                "of_bound": round(mine["s_per_step"] / mine["bound_s"], 3),
                "ours": mine,
                "baseline": base,
            },
        }
        out = ROOT / "benchmarks" / "results" / f"{line['name']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(line, indent=1) + "\n")
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
