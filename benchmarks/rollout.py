"""Rollout throughput through the explorer vs the bare engine, on the same prompts, in the same run.

ours: generated tokens/s of Explorer.explore_step (task resolution, workflow runners, ModelWrapper,
request batching, reward, pipeline, metrics; the buffer write goes to an in-memory sink so the
figure is the explorer's own overhead). baseline: TransformersEngine.generate_batch on the same
prompt token ids with the same sampling settings, all rows in one call. Rounds alternate which
path goes first; ours/baseline are medians, ratio is the median of the per-round ratios (adjacent
runs share the machine's noise, which on a shared 2-core box is large). Last line: the JSON result (also written to benchmarks/results/rollout.json).

    python benchmarks/rollout.py [--quick] [--model builtin:tiny-arith] [--tasks 32] [--repeat 8]

With `--engine vllm` (in .venv-vllm: `make bench-vllm`) the explorer samples on vLLM and the baseline is
the bare `vllm.LLM.generate` of the same engine on the same prompt token ids (n samples per prompt, the
same sampling settings, one call); the model must then be a directory (default: SmolLM2-135M-Instruct
from `make model-smollm2`). Results go to benchmarks/results/rollout_vllm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))


class NullBuffer:
    """Hands out the same task batch every call; counts what is written."""

    def __init__(self, tasks):
        self.tasks = tasks
        self.written = 0

    async def read_tasks(self, taskset, batch_size, reader_id="", rewind=False):
        return SimpleNamespace(tasks=self.tasks, epoch=0, batch_index=0, end_of_data=False)

    async def write(self, buffer, experiences, idempotency_key="", writer_id=""):
        self.written += len(experiences)

    async def report_task_feedback(self, taskset, rates):
        pass


class NoSync:
    async def before_step(self, step):
        return None


def build(args):
    from services.common.config.schema import TrinityConfig
    from services.common.experience import Task as WireTask
    from services.common.monitor import NullMonitor
    from services.explorer.build import build_pool, build_runner
    from services.explorer.explorer import Explorer
    from services.explorer.runner import VersionRef
    from services.models.loading import load_tokenizer
    from services.tasks.arith import ArithSpec, generate

    cfg = TrinityConfig.model_validate(
        {
            "algorithm": {"repeat_times": args.repeat},
            "model": {
                "model_path": args.model,
                "max_prompt_tokens": 64,
                "max_response_tokens": args.max_tokens,
                "min_response_tokens": 0,
            },
            "buffer": {
                "batch_size": args.tasks,
                "explorer_input": {
                    "taskset": {
                        "name": "arith",
                        "default_workflow_type": "arith_workflow",
                        "format": {"prompt_key": "question", "response_key": "answer"},
                        "rollout_args": {"temperature": 1.0},
                    }
                },
            },
            "explorer": {
                "runner_per_model": args.tasks,
                "rollout_model": {"max_batch_size": args.tasks * args.repeat, "engine_type": args.engine},
            },
            "monitor": {"monitor_type": "none"},
        }
    )
    rows = generate(ArithSpec(), args.tasks, seed=0)
    tasks = [WireTask(raw_task=r, task_id=str(i), taskset="arith") for i, r in enumerate(rows)]
    tok = load_tokenizer(args.model)
    pool = build_pool(cfg, tok)
    runner = build_runner(cfg, pool, tok, VersionRef(), [])
    explorer = Explorer(cfg, buffer=NullBuffer(tasks), weights=NoSync(), runner=runner, monitor=NullMonitor())
    prompts = [tok(r["question"], add_special_tokens=False)["input_ids"] for r in rows]
    return cfg, explorer, pool, runner, tasks, prompts


async def explorer_round(explorer, tasks, step):
    t0 = time.perf_counter()
    metrics = await explorer.explore_step(step, tasks)
    return (
        metrics["rollout/response_length/mean"] * metrics["rollout/experiences"] / (time.perf_counter() - t0)
    )


def bare_round(engine, prompts, params):
    t0 = time.perf_counter()
    out = engine.generate_batch(prompts, params)
    tokens = sum(len(o.response_ids) for group in out for o in group)
    return tokens / (time.perf_counter() - t0)


def bare_vllm_round(engine, prompts, params):
    """vllm.LLM.generate itself: n samples per prompt in one call, logprobs of the sampled tokens."""
    sampling = engine.vllm.SamplingParams(
        n=params.n, temperature=params.temperature, max_tokens=params.max_tokens, logprobs=0, detokenize=False
    )
    t0 = time.perf_counter()
    out = engine.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False)
    tokens = sum(len(c.token_ids) for r in out for c in r.outputs)
    return tokens / (time.perf_counter() - t0)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 10")
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument(
        "--model", default=None, help="builtin:tiny-arith (transformers) / SmolLM2 dir (vllm)"
    )
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 10)
    default_model = ".cache/models/SmolLM2-135M-Instruct" if args.engine == "vllm" else "builtin:tiny-arith"
    args.model = args.model or default_model
    import logging

    logging.disable(logging.INFO)  # the per-step log line is not what is measured
    from services.explorer.engines.base import SamplingParams

    cfg, explorer, pool, runner, tasks, prompts = build(args)
    engine = pool[0].engine
    params = SamplingParams(n=args.repeat, temperature=1.0, max_tokens=args.max_tokens)
    try:
        await explorer_round(explorer, tasks, 0)  # warm-up both paths
        bare = bare_vllm_round if args.engine == "vllm" else bare_round
        bare(engine, prompts, params)
        ours, base = [], []
        for r in range(rounds):  # adjacent pairs, alternating which goes first, share the machine's noise
            if r % 2:
                ours.append(await explorer_round(explorer, tasks, r + 1))
            with pool[0]._lock:  # the bare engine is driven directly: keep the batcher off it
                base.append(bare(engine, prompts, params))
            if not r % 2:
                ours.append(await explorer_round(explorer, tasks, r + 1))
    finally:
        runner.close()
        pool.close()
    result = {
        "name": "rollout" if args.engine == "transformers" else "rollout_vllm",
        "unit": "tokens/s",
        "ours": round(statistics.median(ours), 1),
        "baseline": round(statistics.median(base), 1),
        "baseline_name": (
            "bare TransformersEngine.generate_batch, same prompts and sampling, one call"
            if args.engine == "transformers"
            else "bare vllm.LLM.generate of the same engine, same prompts and sampling, one call"
        ),
        "ratio": round(statistics.median(o / b for o, b in zip(ours, base, strict=True)), 4),
        "target_ratio": 0.9,
        "config": {
            "model": args.model,
            "tasks": args.tasks,
            "repeat_times": args.repeat,
            "max_tokens": args.max_tokens,
            "rounds": rounds,
            "ratio_spread": [
                round(min(o / b for o, b in zip(ours, base, strict=True)), 3),
                round(max(o / b for o, b in zip(ours, base, strict=True)), 3),
            ],
            "engine": args.engine,
            "device": str(getattr(engine, "device", "cpu")),
            "torch_threads": __import__("torch").get_num_threads(),
        },
    }
    write_result(result)


def write_result(result: dict) -> None:
    out = pathlib.Path(__file__).resolve().parent / "results" / f"{result['name']}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    asyncio.run(main())
