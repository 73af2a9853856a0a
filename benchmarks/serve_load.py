"""Serve mode under load and crashes: N concurrent agent sessions against a real serve + train pair.

The pair (benchmarks/lib/serve_load_stack.py): `trinity run` of a mode-serve config (buffer,
synchronizer, the proxy) on builtin:tiny-arith, and a `mode: train` trainer beside it that trains
GRPO groups from the buffer and publishes a version every step, which the proxy loads between
requests. The agents (serve_load_agents.py): `--sessions` at once, each session two chat turns (the
second extends the history), /feedback with a reward and a task id (`--group` sessions per task:
one GRPO group), /commit. Retryable errors (connection refused / reset, 503, 429) are retried with
backoff and counted; any other is a failure.

1. Latency, like for like (before the trainer starts, `--rounds` alternating rounds of
   `--compare-s` seconds a side): chat completions through the proxy (HTTP, validation, template,
   session linking, the SQLite history, JSON) against the same token traffic (question ids, then
   question + reply + follow-up ids; same sampling, same concurrency) straight to a bare
   `BatchingEngine` of the same model in this process, one torch thread like the proxy's.
2. Load (`--minutes`): the agents while the trainer trains and versions advance; `--kill
   proxy,buffer,trainer` SIGKILLs each named service once, spread over the run (`trinity run`
   restarts the proxy and the buffer, the pair's supervisor the trainer).
3. Checks (serve_load_audit.py): no request failed but by a retryable error; every acknowledged
   commit is in the buffer exactly once, as the responses its agent got; summary.json's counters
   add up (written = trained + buffered + dropped = the proxy's experiences written and committed).

Result: p50 latency of a chat completion through the proxy / the bare engine's (lower is better);
p99s, the load phase's latencies (with training and drills), retries, drill recovery times,
versions served and the checks in `config`. Last line: the JSON result (also
benchmarks/results/serve_load.json); exit 1 when a check failed.

    python benchmarks/serve_load.py [--quick] [--sessions 64] [--minutes 10] [--kill proxy,buffer,trainer]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks.lib.serve_load_agents import Tally, Tasks, run_agents, run_bare  # noqa: E402
from benchmarks.lib.serve_load_audit import audit, buffer_rows  # noqa: E402
from benchmarks.lib.serve_load_stack import EXPERIENCES, SERVICES, Pair, pair_config  # noqa: E402

MODEL = "builtin:tiny-arith"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def quantiles(values: list[float]) -> dict[str, Any]:
    p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
    return {
        "n": len(values),
        "p50_s": None if p50 is None else round(p50, 4),
        "p99_s": None if p99 is None else round(p99, 4),
    }


async def compare(pair: Pair, args: argparse.Namespace, tally: Tally) -> list[float]:
    """Alternating rounds, proxy and bare engine; returns the bare engine's call latencies."""
    import torch

    from services.explorer.engines.base import BatchingEngine
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.models.loading import load_causal_lm, load_tokenizer

    torch.set_num_threads(1)
    tok = load_tokenizer(MODEL)
    engine = BatchingEngine(
        TransformersEngine(
            load_causal_lm(MODEL), eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id
        )
    )
    bare: list[float] = []
    try:
        for r in range(args.rounds):
            for side in ("proxy", "bare") if r % 2 == 0 else ("bare", "proxy"):
                if side == "proxy":
                    tasks = Tasks(args.group, args.seed + r, prefix=f"c{r}-")
                    await run_agents(pair.url, args.sessions, tasks, args.compare_s, tally, args.max_tokens)
                else:
                    bare += await run_bare(
                        engine, tok, args.sessions, args.compare_s, args.max_tokens, args.seed + r
                    )
    finally:
        engine.close()
    return bare


async def drills(pair: Pair, kills: list[str], seconds: float, started: float) -> dict[str, float]:
    """SIGKILL each service of `kills` once, evenly spread over the load phase; seconds to recover."""
    recovered = {}
    for i, service in enumerate(kills):
        await asyncio.sleep(max(0.0, started + seconds * (i + 1) / (len(kills) + 1) - time.monotonic()))
        recovered[service] = round(await pair.kill(service), 2)
    return recovered


async def drain(pair: Pair, timeout: float = 120) -> dict[str, Any]:
    """Wait until the proxy has written every committed group (a buffer restart defers writes)."""
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(f"{pair.url}/stats") as response:
                stats = dict(await response.json())
            if not stats["groups"].get("pending") or time.monotonic() > deadline:
                return stats
            await asyncio.sleep(0.5)


async def load_run(root: pathlib.Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start the pair, compare, load with drills, stop, audit; returns the result (with `problems`)."""
    kills = [k for k in args.kill.split(",") if k]
    for k in kills:
        if k not in SERVICES:
            raise SystemExit(f"--kill: {k!r} is not one of {', '.join(SERVICES)}")
    cfg = pair_config(
        root,
        sessions=args.sessions,
        group=args.group,
        batch=args.batch,
        max_tokens=args.max_tokens,
        save_interval=args.save_interval,
    )
    pair = Pair(root, cfg)
    cmp_tally, load_tally = Tally(), Tally()
    wall = time.monotonic()
    try:
        await pair.start()
        bare = await compare(pair, args, cmp_tally) if args.rounds and args.compare_s > 0 else []
        await pair.start_trainer()
        seconds = args.minutes * 60
        started = time.monotonic()
        agents = asyncio.create_task(
            run_agents(
                pair.url,
                args.sessions,
                Tasks(args.group, args.seed, "l-"),
                seconds,
                load_tally,
                args.max_tokens,
            )
        )
        recovered = await drills(pair, kills, seconds, started)
        await agents
        load_s = time.monotonic() - started
        stats = await drain(pair)
    finally:
        stage = pair.stop()
    rows = buffer_rows(pair.run_dir / "buffer" / f"{EXPERIENCES}.sqlite")
    acked = {**cmp_tally.acked, **load_tally.acked}
    problems, figures = audit(acked, rows, stage, cmp_tally.failures + load_tally.failures)
    versions = sorted(load_tally.versions)
    if not versions or versions[-1] == 0:
        problems.append(f"the proxy served no new version during the load (versions seen: {versions})")
    missing = [k for k in kills if k not in recovered]
    if missing:
        problems.append(f"drills not done: {missing}")
    ours = cmp_tally.latency["chat"]
    p50o, p50b = (statistics.median(ours) if ours else None), (statistics.median(bare) if bare else None)
    return {
        "name": "serve_load",
        "unit": f"s (p50 latency of one chat completion, {args.sessions} sessions at once)",
        "ours": None if p50o is None else round(p50o, 4),
        "baseline": None if p50b is None else round(p50b, 4),
        "baseline_name": "the same token traffic to a bare BatchingEngine of the same model, same concurrency",
        "ratio": None if not (p50o and p50b) else round(p50o / p50b, 3),
        "target_ratio": 1.2,
        "lower_is_better": True,
        "config": {
            "model": MODEL,
            "sessions": args.sessions,
            "group": args.group,
            "batch_groups": args.batch,
            "max_tokens": args.max_tokens,
            "compare": {
                "rounds": args.rounds,
                "seconds_a_side": args.compare_s,
                "proxy_chat": quantiles(ours),
                "bare_engine": quantiles(bare),
            },
            "load": {
                "minutes": args.minutes,
                "seconds": round(load_s, 1),
                "sessions_committed": load_tally.sessions,
                "sessions_per_s": round(load_tally.sessions / load_s, 2),
                **{route: quantiles(v) for route, v in load_tally.latency.items()},
                "versions_served": {
                    "first": versions[0] if versions else None,
                    "last": versions[-1] if versions else None,
                    "distinct": len(versions),
                },
            },
            "kills": kills,
            "recovery_s": recovered,
            "retries": dict(cmp_tally.retries + load_tally.retries),
            "failures": len(cmp_tally.failures) + len(load_tally.failures),
            "trainer_starts": pair.trainer_starts,
            "replayed_completions": stats["counters"].get("completions_replayed", 0),
            **figures,
            "wall_s": round(time.monotonic() - wall, 1),
        },
        "problems": problems,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=64, help="agents at once, each one session at a time")
    parser.add_argument("--minutes", type=float, default=10.0, help="the load phase")
    parser.add_argument(
        "--kill", default="", help="comma-separated: SIGKILL each once during the load (proxy,buffer,trainer)"
    )
    parser.add_argument("--compare-s", type=float, default=60.0, help="seconds a side of each latency round")
    parser.add_argument("--rounds", type=int, default=2, help="latency rounds (0: none)")
    parser.add_argument("--group", type=int, default=4, help="sessions per task id (algorithm.repeat_times)")
    parser.add_argument("--batch", type=int, default=4, help="groups per training step (buffer.batch_size)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--save-interval", type=int, default=10, help="trainer checkpoints (resume points)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--root", default="", help="keep the run here (default: a temporary directory, removed)"
    )
    parser.add_argument("--quick", action="store_true", help="1 minute of load, 2 rounds of 10 s")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.compare_s = 1.0, 10.0
    return args


def main() -> None:
    args = parse()
    root = pathlib.Path(args.root or tempfile.mkdtemp(prefix="serve-load-"))
    result = asyncio.run(load_run(root, args))
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)
    out = pathlib.Path(__file__).resolve().parent / "results" / "serve_load.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    for problem in result["problems"]:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    print(json.dumps(result))
    sys.exit(1 if result["problems"] else 0)


if __name__ == "__main__":
    main()
