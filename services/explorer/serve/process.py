"""The explorer process in mode serve: engines, history, synchronizer and buffer, then the proxy.

Start-up: load the engines; open the history (explorer.db_url); register with the synchronizer as
an explorer member and load the version the plan names (a restarted proxy serves what it should);
write the groups a killed predecessor acknowledged but did not write; listen on
explorer.listen_address:proxy_port (TLS from services.tls) and write the URL to
<run dir>/serve/proxy_url. Then, until SIGTERM: a weight check every
explorer.service_status_check_interval seconds, and a sweep of expired sessions and pending writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from aiohttp import web

from services.common.config.schema import TrinityConfig
from services.common.logging import get_logger
from services.common.security import http_ssl_context, load_token
from services.explorer.serve.app import make_app
from services.explorer.serve.commits import Commits
from services.explorer.serve.core import ServeCore
from services.explorer.serve.gate import EngineGate
from services.explorer.serve.history import History, default_db_url
from services.explorer.serve.protocol import Limits
from services.explorer.serve.weights import ServeWeights

log = get_logger("explorer.serve")


def build_engines(cfg: TrinityConfig) -> tuple[Any, Any, Any]:
    """(tokenizer, engine pool, the ModelWrapper that renders prompts) — loads the model."""
    from services.explorer.build import build_pool
    from services.explorer.model_wrapper import ModelWrapper
    from services.models.loading import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.model_path, cfg.model.tokenizer_path)
    pool = build_pool(cfg, tokenizer)
    rm = cfg.explorer.rollout_model
    wrapper = ModelWrapper(
        pool[0],
        tokenizer,
        max_prompt_tokens=cfg.model.max_prompt_tokens,
        max_response_tokens=cfg.model.max_response_tokens,
        chat_template=cfg.model.custom_chat_template,
        enable_thinking=rm.enable_thinking,
        tool_call_parser=rm.tool_call_parser,
        reasoning_parser=rm.reasoning_parser,
        model_name=cfg.model.model_path,
    )
    return tokenizer, pool, wrapper


def limits_of(cfg: TrinityConfig) -> Limits:
    model = cfg.model
    return Limits(
        max_tokens=model.max_response_tokens,
        max_n=cfg.explorer.serve.max_n,
        min_tokens=model.min_response_tokens,
        temperature=1.0 if model.temperature is None else model.temperature,
        top_p=1.0 if model.top_p is None else model.top_p,
        top_k=max(model.top_k or 0, 0),
    )


def trained_sampling(cfg: TrinityConfig) -> tuple[float, float, int]:
    """(temperature, top_p, top_k) the trainer computes logprobs under (services/trainer/settings.py:
    model.temperature, 1.0 when unset or 0) — what a committed session must have been sampled with."""
    from services.explorer.serve.feedback import logprob_sampling

    model = cfg.model
    return logprob_sampling(
        model.temperature or 1.0, 1.0 if model.top_p is None else model.top_p, model.top_k or 0
    )


def proxy_url(cfg: TrinityConfig, port: int) -> str:
    host = cfg.explorer.listen_address
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    scheme = "https" if cfg.services.tls.cert_file else "http"
    return f"{scheme}://{host}:{port}"


def _write_url(path: str, url: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(url + "\n")


class ServeStatus:
    """What the explorer's GetInfo (and so `trinity status` and `trinity run`'s progress line) shows
    in mode serve: the weight checks as steps, the version served, the experiences written."""

    state = "serving"
    last_eval: dict[str, float] = {}  # noqa: RUF012 - read-only: the agents evaluate, not the proxy
    evaluator = type("NoEval", (), {"tasksets": [], "names": []})()

    def __init__(self, weights: ServeWeights) -> None:
        self.weights = weights
        self.written = 0
        self.last_metrics: dict[str, float] = {}

    @property
    def step(self) -> int:
        return self.weights.step

    @property
    def model_version(self) -> int:
        return self.weights.version

    async def refresh(self, commits: Commits) -> None:
        counters = (await commits.stats())["counters"]
        self.written = int(counters.get("experiences_written", 0))


async def _sweep(commits: Commits, interval: float, status: ServeStatus) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await commits.sweep()
            await status.refresh(commits)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - retried at the next sweep
            log.warning("serve_sweep_failed", error=f"{type(exc).__name__}: {exc}")


async def serve_proxy(cfg: TrinityConfig, stop: asyncio.Future[Any], servicer: Any = None) -> None:
    """Run the proxy until `stop` completes (the gRPC server's wait: SIGTERM); `servicer`: the
    explorer's gRPC servicer, which reports the proxy's ServeStatus once it serves."""
    from services.buffer.client import BufferClient
    from services.synchronizer.client import SynchronizerClient
    from services.synchronizer.weights import WeightReceiver

    ex = cfg.explorer
    tokenizer, pool, wrapper = await asyncio.to_thread(build_engines, cfg)
    history = History(ex.db_url or default_db_url(cfg.run_dir))
    sync = await SynchronizerClient.connect(cfg.services.synchronizer.address, services_cfg=cfg.services)
    runner: web.AppRunner | None = None
    tasks: list[asyncio.Task[Any]] = []
    try:
        await sync.register(ex.name, "explorer")
        sync.start_heartbeat()
        gates = [EngineGate(engine) for engine in pool.engines]
        weights = ServeWeights(gates, sync, WeightReceiver(sync, cfg), min_running=ex.min_running_model_num)
        await weights.check()
        async with await BufferClient.connect(
            cfg.services.buffer.address, services_cfg=cfg.services
        ) as buffer:
            commits = Commits(
                history,
                buffer,
                buffer_name=cfg.buffer.trainer_input.experience_buffer.name,
                producer=ex.name,
                group_size=cfg.algorithm.repeat_times,
                ttl_s=ex.serve.session_ttl_s,
                chunk=cfg.buffer.max_batch_items,
                trained=trained_sampling(cfg),
            )
            await commits.flush()
            core = ServeCore(
                wrapper=wrapper,
                gates=gates,
                history=history,
                max_prompt_tokens=cfg.model.max_prompt_tokens,
                max_concurrent=ex.serve.max_concurrent_requests,
            )
            app = make_app(
                core,
                commits,
                limits_of(cfg),
                model_name=cfg.model.model_path,
                token=load_token(cfg.services.auth),
                max_request_bytes=ex.serve.max_request_bytes,
                version=lambda: weights.version,
            )
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(
                runner, ex.listen_address, ex.proxy_port, ssl_context=http_ssl_context(cfg.services.tls)
            )
            await site.start()
            port = int(runner.addresses[0][1])
            url = proxy_url(cfg, port)
            _write_url(os.path.join(cfg.run_dir, "serve", "proxy_url"), url)
            log.info("serve_proxy_listening", url=url, model_version=weights.version)
            status = ServeStatus(weights)
            await status.refresh(commits)
            if servicer is not None:
                servicer.explorer = status
            interval = ex.service_status_check_interval
            tasks = [
                asyncio.create_task(weights.run(interval)),
                asyncio.create_task(_sweep(commits, min(interval, ex.serve.session_ttl_s / 4), status)),
            ]
            await stop
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if runner is not None:
            await runner.cleanup()
        await sync.close()
        history.close()
        pool.close()
