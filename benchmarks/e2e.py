"""One small GRPO job, end to end: our four services (`trinity run`) vs TRL's GRPOTrainer.

    .venv/bin/python benchmarks/e2e.py [--quick] [--steps 20] [--batch 16] [--repeat 8] [--sync-offset 1]

TRL is a benchmark-only dependency (`make bench` installs it); it is never needed by the package
or by the tests. Both sides run the same job on CPU: the same starting weights (builtin:tiny-arith
after a short SFT warm-up on easy problems so that rewards are not all zero, saved once to a
temporary directory that both load), the same prompts in the same order (2-digit additions made
by services.tasks.arith), `batch` prompts × `repeat` samples per step, temperature 1.0, `max_tokens` new tokens, AdamW at a
constant lr without weight decay, grad clip 1.0, one update per batch, no KL term (TRL's default
beta 0; our kl_loss_fn none), token-mean loss (TRL's "dapo"), and the same reward function
(services.explorer.rewards.exact.arith_reward: exact match of the text before EOS).

Figure: steady-state wall time per step, (t_last − t_first) / (N − 1) over the times at which
steps finished (our trainer's progress.jsonl; a TRL callback), so start-up (process spawn, model
load, gRPC connections) is excluded; total wall time including start-up is in `config`. Each side
runs `--rounds` times (default 2) in alternating order (TRL, ours, ours, TRL) so that the machine's
drifting load hits both alike; figures are means over rounds. Rewards
are the mean reward of the sampled completions (ours: critic/rewards/mean; TRL: reward), first
step and mean of the last quarter of the steps. Last line: the JSON object of benchmarks/README.

Threads: every process of both sides gets `--threads` torch threads (default 1). On the shared
2-core development machine, two threads per process made one process 5-10x slower (OpenMP
threads contending with the other load), which swamped the comparison; TRL runs in one process
and ours in several (trainer and explorer overlap), which is part of what is being compared.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:  # `python benchmarks/e2e.py` puts benchmarks/, not the root, on the path
    sys.path.insert(0, str(ROOT))

from benchmarks.lib.e2e_figures import (  # noqa: E402 - after the sys.path fix above
    read_progress,
    result_line,
)
from benchmarks.lib.e2e_trl import run_trl  # noqa: E402

TRL_MISSING = (
    "benchmarks/e2e.py needs TRL (a benchmark-only dependency). Run `make bench`, which installs it, or:\n"
    "  .venv/bin/pip install trl -c <constraints pinning the installed torch and transformers>"
)


def say(message: str) -> None:
    print(f"[e2e] {message}", file=sys.stderr, flush=True)


def prepare(work: pathlib.Path, args: argparse.Namespace) -> tuple[pathlib.Path, pathlib.Path]:
    """Write the prompts (exactly steps × batch, read in file order by both) and the starting model."""
    from services.models.loading import load_causal_lm, load_tokenizer, save_model
    from services.tasks.arith import ArithSpec, generate, write_jsonl

    rows = generate(ArithSpec(digits=2), args.steps * args.batch, seed=args.seed)
    data = write_jsonl(rows, work / "rl.jsonl")
    model = load_causal_lm("builtin:tiny-arith", dtype="float32", seed=args.seed)
    tokenizer = load_tokenizer("builtin:tiny-arith")
    if args.sft_steps:
        sft_warmup(model, tokenizer, args)
    return data, save_model(model, tokenizer, work / "model")


def sft_warmup(model: Any, tokenizer: Any, args: argparse.Namespace) -> None:
    """A few SFT steps on easy problems (no carries, disjoint seed) so GRPO starts with some reward."""
    import torch

    from services.tasks.arith import ArithSpec, generate

    rows = generate(ArithSpec(digits=2, max_carries=0), 512, seed=args.seed + 1)
    texts = [r["question"] + r["answer"] + tokenizer.eos_token for r in rows]
    ids = torch.tensor([tokenizer(t)["input_ids"] for t in texts])  # every row has the same length
    prompt_len = len(tokenizer(rows[0]["question"])["input_ids"])
    labels = ids.clone()
    labels[:, :prompt_len] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=args.sft_lr)
    gen = torch.Generator().manual_seed(args.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: on a busy 2-core machine 1 thread was ~10x faster than 2
    model.train()
    try:
        for _ in range(args.sft_steps):
            pick = torch.randint(0, len(rows), (128,), generator=gen)
            loss = model(input_ids=ids[pick], labels=labels[pick]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
        model.eval()


# ---- ours ----------------------------------------------------------------------------------------


def our_config(
    work: pathlib.Path, data: pathlib.Path, model_dir: pathlib.Path, args: argparse.Namespace
) -> dict[str, Any]:
    """A one-stage GRPO run (mode both, weights over a process group every step, no evals)."""
    return {
        "project": "bench",
        "name": "e2e",
        "mode": "both",
        "continue_from_checkpoint": True,  # keeps the run dir name fixed (no timestamp suffix)
        "checkpoint_root_dir": str(work / "runs"),
        "model": {
            "model_path": str(model_dir),
            "max_prompt_tokens": 16,
            "max_response_tokens": args.max_tokens,
        },
        "algorithm": {
            "algorithm_type": "grpo",
            "repeat_times": args.repeat,
            "kl_loss_fn": "none",
            "optimizer": {"lr": args.lr, "weight_decay": 0.0, "grad_clip": 1.0},
        },
        "buffer": {
            "batch_size": args.batch,
            "total_steps": args.steps,
            "explorer_input": {
                "taskset": {
                    "name": "rl_tasks",
                    "storage_type": "file",
                    "path": str(data),
                    "format": {"prompt_key": "question", "response_key": "answer"},
                    "rollout_args": {"temperature": 1.0, "max_tokens": args.max_tokens},
                    "default_workflow_type": "arith_workflow",
                },
            },
            "trainer_input": {"experience_buffer": {"name": "experiences", "storage_type": "queue"}},
        },
        "explorer": {"eval_on_startup": False, "eval_interval": 100000},
        # nccl (default: a gloo group on CPU) or checkpoint files (what the CPU demo uses)
        "synchronizer": {
            "sync_method": args.sync_method,
            "sync_interval": 1,
            "sync_offset": args.sync_offset,
        },
        "trainer": {"save_interval": 100000, "micro_batch_size": args.batch * args.repeat},
        "monitor": {"monitor_type": "none"},
        "services": {name: {"port": 0} for name in ("buffer", "synchronizer", "trainer", "explorer")},
    }


def run_ours(
    work: pathlib.Path, data: pathlib.Path, model_dir: pathlib.Path, args: argparse.Namespace
) -> dict[str, Any]:
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    config = work / "ours.yaml"
    config.write_text(yaml.safe_dump(our_config(work, data, model_dir, args), sort_keys=False))
    log = work / "ours.log"
    started = time.time()
    with log.open("wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "services.cli.main", "run", "--config", str(config)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            },
        )
    wall = time.time() - started
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"trinity run failed (exit {proc.returncode}):\n{tail}")
    times, rewards = read_progress(work / "runs" / "bench" / "e2e" / "trainer" / "progress.jsonl")
    return {"step_times": times, "rewards": rewards, "wall_s": wall}


# ---- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 steps instead of 20")
    parser.add_argument(
        "--steps", type=int, default=None, help="GRPO steps on each side (default 20, --quick 5)"
    )
    parser.add_argument("--batch", type=int, default=16, help="prompts per step (default 16)")
    parser.add_argument("--repeat", type=int, default=8, help="samples per prompt (default 8)")
    parser.add_argument("--max-tokens", type=int, default=6, help="new tokens per sample (default 6)")
    parser.add_argument("--lr", type=float, default=2e-4, help="AdamW learning rate (default 2e-4)")
    parser.add_argument(
        "--sft-steps",
        type=int,
        default=150,
        help="SFT warm-up steps of the shared start weights (default 150; 0: none)",
    )
    parser.add_argument("--sft-lr", type=float, default=2e-3, help="SFT warm-up learning rate (default 2e-3)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per process on both sides (OMP_NUM_THREADS; default 1; 0: torch's default)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="runs of each side, alternating order (default 2, --quick 1)"
    )
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--sync-method",
        choices=("checkpoint", "nccl"),
        default="nccl",
        help="our weight sync: nccl (default; a gloo group on CPU) or checkpoint files (what the CPU demo uses)",
    )
    parser.add_argument(
        "--sync-offset",
        type=int,
        default=0,
        choices=(0, 1),
        help="our synchronizer.sync_offset: 0 on-policy (default), 1: the explorer generates step n+1 "
        "while the trainer trains step n (one step stale; TRL stays on-policy). Target ratio 1.0 / 0.7",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, run dir)")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 5 if args.quick else 20
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the figure is a difference of step times)")
    return args


def run_rounds(
    work: pathlib.Path, data: pathlib.Path, model_dir: pathlib.Path, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Both sides `args.rounds` times, alternating which goes first (TRL, ours, ours, TRL, ...)."""
    ours: list[dict[str, Any]] = []
    trl_side: list[dict[str, Any]] = []
    for r in range(args.rounds):
        round_dir = work / f"round{r + 1}"
        for side in ("trl", "ours") if r % 2 == 0 else ("ours", "trl"):
            if side == "trl":
                say(f"round {r + 1}/{args.rounds}: TRL GRPOTrainer, {args.steps} steps")
                trl_side.append(run_trl(round_dir, data, model_dir, args))
            else:
                say(
                    f"round {r + 1}/{args.rounds}: ours (trinity run, log {round_dir / 'ours.log'}), {args.steps} steps"
                )
                ours.append(run_ours(round_dir, data, model_dir, args))
    return ours, trl_side


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import trl
    except ImportError:
        print(TRL_MISSING, file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        import torch

        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # our children inherit it
        torch.set_num_threads(args.threads)  # TRL runs in this process
    work = pathlib.Path(tempfile.mkdtemp(prefix="trinity-e2e-"))
    try:
        say(f"preparing data and start weights ({args.sft_steps} SFT warm-up steps) in {work}")
        data, model_dir = prepare(work, args)
        ours, trl_side = run_rounds(work, data, model_dir, args)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    import torch

    config = {
        "model": "builtin:tiny-arith",
        "task": "2-digit addition (services.tasks.arith)",
        "steps": args.steps,
        "quick": args.quick,
        "batch_size": args.batch,
        "repeat_times": args.repeat,
        "completions_per_step": args.batch * args.repeat,
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
        "lr": args.lr,
        "sft_warmup_steps": args.sft_steps,
        "device": "cpu",
        "sync_method": args.sync_method,
        "sync_offset": args.sync_offset,
        "torch_threads": torch.get_num_threads(),
    }
    result = result_line(ours, trl_side, trl.__version__, config)
    if args.sync_offset:  # issue 21's second figure: generation of step n+1 overlaps training of step n
        result.update(name="e2e_grpo_step_time_sync_offset_1", target_ratio=0.7)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "e2e.json" if not args.sync_offset else f"e2e_offset{args.sync_offset}.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
