"""Latency of a chat completion through the serve-mode proxy vs the bare engine, in the same run.

ours: one chat completion through the proxy over loopback HTTP (aiohttp client -> routes, request
validation, chat template, session linking, the engine, the SQLite history write, the JSON answer),
`--sessions` agents at once, each its own session, one request after another. baseline: the same
prompt token ids and sampling settings straight to the same BatchingEngine (`generate_async`), with
the same concurrency. Rounds alternate which side goes first. Reported: p50 latency of ours / the
baseline's (lower is better); p99s and the overhead in ms in `config`. Last line: the JSON result
(also benchmarks/results/serve_overhead.json).

    python benchmarks/serve_overhead.py [--quick] [--model builtin:tiny-arith] [--sessions 8] [--requests 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

PROMPT = "What is $63 + 2$? Give the final answer as a LaTeX \\boxed{} expression."


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def run(args: argparse.Namespace) -> dict:
    import aiohttp
    from aiohttp import web

    from services.explorer.engines.base import BatchingEngine, SamplingParams
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.explorer.model_wrapper import ModelWrapper
    from services.explorer.serve.app import make_app
    from services.explorer.serve.commits import Commits
    from services.explorer.serve.core import ServeCore
    from services.explorer.serve.gate import EngineGate
    from services.explorer.serve.history import History
    from services.explorer.serve.protocol import Limits
    from services.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer(args.model)
    engine = BatchingEngine(
        TransformersEngine(load_causal_lm(args.model), eos_token_ids=[-1], pad_token_id=tok.pad_token_id)
    )  # no EOS: every reply is max_tokens long on both sides
    tmp = tempfile.TemporaryDirectory()
    history = History(f"sqlite:///{tmp.name}/h.db")
    wrapper = ModelWrapper(engine, tok, max_response_tokens=args.max_tokens)
    core = ServeCore(
        wrapper=wrapper,
        gates=[EngineGate(engine)],
        history=history,
        max_prompt_tokens=512,
        max_concurrent=256,
    )
    commits = Commits(history, None, buffer_name="exp", producer="bench", group_size=1, ttl_s=3600, chunk=64)
    app = make_app(
        core,
        commits,
        Limits(max_tokens=args.max_tokens, max_n=1),
        model_name=args.model,
        token=None,
        max_request_bytes=1 << 20,
        version=lambda: 0,
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"
    ids = core.prompt_ids([], wrapper.render_chat([{"role": "user", "content": PROMPT}]))[0].tolist()
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens)
    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": args.max_tokens}
    ours: list[float] = []
    base: list[float] = []
    async with aiohttp.ClientSession() as http:

        async def proxy_agent(agent: int, round_: int) -> None:
            for i in range(args.requests):
                t0 = time.perf_counter()
                headers = {"X-Session-Id": f"r{round_}-a{agent}-{i}"}
                async with http.post(url, json=body, headers=headers) as response:
                    assert response.status == 200, await response.text()
                    await response.read()
                ours.append(time.perf_counter() - t0)

        async def bare_agent() -> None:
            for _ in range(args.requests):
                t0 = time.perf_counter()
                await engine.generate_async([ids], params)
                base.append(time.perf_counter() - t0)

        await asyncio.gather(*(bare_agent() for _ in range(2)))  # warm-up
        for round_ in range(args.rounds):
            sides = (
                [("ours", proxy_agent), ("base", None)]
                if round_ % 2 == 0
                else [("base", None), ("ours", proxy_agent)]
            )
            for name, _ in sides:
                if name == "ours":
                    await asyncio.gather(*(proxy_agent(a, round_) for a in range(args.sessions)))
                else:
                    await asyncio.gather(*(bare_agent() for _ in range(args.sessions)))
    await runner.cleanup()
    history.close()
    engine.close()
    tmp.cleanup()
    p50o, p50b = statistics.median(ours), statistics.median(base)
    return {
        "name": "serve_overhead",
        "unit": "s (p50 latency of one chat completion)",
        "ours": round(p50o, 4),
        "baseline": round(p50b, 4),
        "baseline_name": "the same BatchingEngine.generate_async, same prompt ids, same concurrency",
        "ratio": round(p50o / p50b, 3),
        "target_ratio": 1.2,
        "lower_is_better": True,
        "config": {
            "model": args.model,
            "sessions": args.sessions,
            "requests_per_session": args.requests,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "p99_ours_s": round(percentile(ours, 0.99), 4),
            "p99_baseline_s": round(percentile(base, 0.99), 4),
            "overhead_p50_ms": round(1000 * (p50o - p50b), 2),
            "overhead_p99_ms": round(1000 * (percentile(ours, 0.99) - percentile(base, 0.99)), 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin:tiny-arith")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 3, 2
    result = asyncio.run(run(args))
    out = pathlib.Path(__file__).resolve().parent / "results" / "serve_overhead.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
