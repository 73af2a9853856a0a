"""The one interface every inference engine implements, and the request batcher in front of it.

An engine turns token-id prompts into sampled responses with the per-token logprobs of the
sampled tokens *under the sampling distribution* (temperature, top-k and top-p applied), so the
trainer's importance ratio starts at exactly 1 for on-policy data. Engines are synchronous and
single-threaded; `BatchingEngine` gives them a thread of their own and merges the requests of
concurrent workflows (sync ones in threads, async ones on the event loop) into large batches,
which is where the throughput comes from.

Streaming: an engine whose `streams` is True takes an `on_token(row, token_id, logprob)` callback in
`generate_batch` and calls it on its own thread for each token as it is sampled (row = the index
of the sequence in the flat batch, prompt-major then sample). `BatchingEngine.submit(...,
on_token=)` routes each token of a shared batch to the request it belongs to; engines that do not
stream never call it, and their callers get every token with the finished outputs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from services.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from services.common.logging import get_logger

log = get_logger("explorer.engine")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling arguments (Trinity's rollout_args / vLLM's names).

    top_k 0 (or -1) and top_p 1.0 disable those filters; temperature 0 is greedy (logprobs then
    come from the untempered distribution).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 512
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise InvalidArgument(f"n must be >= 1, got {self.n}", field="rollout_args.n")
        if self.temperature < 0:
            raise InvalidArgument(
                f"temperature must be >= 0, got {self.temperature}", field="rollout_args.temperature"
            )
        if not 0 < self.top_p <= 1:
            raise InvalidArgument(f"top_p must be in (0, 1], got {self.top_p}", field="rollout_args.top_p")
        if self.max_tokens < 1:
            raise InvalidArgument(
                f"max_tokens must be >= 1, got {self.max_tokens}", field="rollout_args.max_tokens"
            )

    @property
    def batch_key(self) -> tuple[Any, ...]:
        """Requests whose keys are equal can share one generation batch."""
        return (self.temperature, self.top_p, max(self.top_k, 0), self.max_tokens, self.min_tokens)


@dataclass
class GenerationOutput:
    """One sampled response. response_ids include the EOS token when the model stopped on it."""

    prompt_ids: list[int]
    response_ids: np.ndarray  # int64 [R]
    logprobs: np.ndarray  # float32 [R]
    finish_reason: str = "length"  # "stop" (EOS) or "length" (max_tokens)
    token_versions: np.ndarray | None = None
    """int64 [R]: the model version that sampled each response token, where the engine records it
    (partial rollouts: weights changed between two tokens); None: one version for all."""


class TokenSink(Protocol):
    """Called on the engine's thread for each sampled token: (sequence index, token id, logprob)."""

    def __call__(self, row: int, token_id: int, logprob: float) -> None: ...


class InferenceEngine(ABC):
    """A model that samples. Not thread-safe: BatchingEngine serializes every call."""

    max_batch_size: int = 256
    model_version: int = 0
    """The version of the weights loaded, set by every versioned load (BatchingEngine.update_weights_async
    with a version, push_weights); engines that record token_versions stamp each token with it."""
    streams: bool = False
    """True: generate_batch takes `on_token` and calls it for each token as it is sampled."""

    @abstractmethod
    def generate_batch(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        """For each prompt, `params.n` samples. Engines with `streams` also take `on_token: TokenSink | None`
        (a keyword argument) and call it per sampled token, row = prompt index * n + sample index."""

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Replace the weights (names as in the trainer's state dict)."""

    def score_batch(self, sequences: list[list[int]], temperature: float = 1.0) -> list[np.ndarray]:
        """For each sequence, float32 [len - 1]: logprob of token i+1 given tokens 0..i (teachers)."""
        raise FailedPrecondition(
            f"{type(self).__name__} cannot score sequences (teacher logprobs)", field="engine_type"
        )

    def load_checkpoint(self, path: str) -> None:
        """Load weights from a checkpoint directory of safetensors files."""
        from services.explorer.engines.weights import iter_checkpoint_tensors

        self.update_weights(iter_checkpoint_tensors(path))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free the model."""


@dataclass
class _Request:
    prompts: list[list[int]]
    params: SamplingParams
    on_token: TokenSink | None = None
    future: concurrent.futures.Future[list[list[GenerationOutput]]] = field(
        default_factory=concurrent.futures.Future
    )


@dataclass
class EngineStats:
    """Counters since start: generated tokens and seconds the engine spent generating."""

    generated_tokens: int = 0
    busy_s: float = 0.0
    batches: int = 0
    sequences: int = 0


class BatchingEngine:
    """Runs one engine on its own thread; concurrent requests with equal sampling settings share a batch."""

    def __init__(
        self,
        engine: InferenceEngine,
        *,
        max_batch_size: int | None = None,
        name: str = "engine-0",
        gather_s: float = 0.002,
        log_requests: bool = False,
    ) -> None:
        self.engine = engine
        self.name = name
        # explorer.rollout_model.enable_log_requests: one INFO line per generation batch
        self.log_requests = log_requests
        self.max_batch_size = max_batch_size or engine.max_batch_size
        # After the first request of a batch arrives, wait this long (s) for the others that concurrent
        # workflows submit in the same instant, so they share one batch instead of trickling in.
        self.gather_s = gather_s
        self.stats = EngineStats()
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._lock = threading.Lock()  # held while generating or changing weights
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def streams(self) -> bool:
        """Whether `on_token` is called while generating (else never: the tokens come with the outputs)."""
        return bool(self.engine.streams)

    def submit(
        self, prompts: list[list[int]], params: SamplingParams, on_token: TokenSink | None = None
    ) -> concurrent.futures.Future[list[list[GenerationOutput]]]:
        """`on_token(row, token_id, logprob)`: each token of this request as it is sampled (engine thread;
        row = prompt index * n + sample index), for engines that stream."""
        if self._closed:
            raise Unavailable("the inference engine is closed")
        request = _Request(prompts, params, on_token)
        self._queue.put(request)
        return request.future

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[GenerationOutput]]:
        """Blocking form (for sync workflows, which run in threads)."""
        return self.submit(prompts, params).result()

    async def generate_async(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        return await asyncio.wrap_future(self.submit(prompts, params))

    def with_weights_locked(self, fn: Callable[[InferenceEngine], Any]) -> Any:
        """Run `fn(engine)` while no batch is generating (weight updates, checkpoint loads)."""
        with self._lock:
            return fn(self.engine)

    async def update_weights_async(
        self, fn: Callable[[InferenceEngine], Any], version: int | None = None
    ) -> Any:
        """`fn(engine)` between batches; with `version`, the engine holds that version afterwards."""

        def load(engine: InferenceEngine) -> Any:
            out = fn(engine)
            if version is not None:
                engine.model_version = int(version)
            return out

        return await asyncio.to_thread(self.with_weights_locked, load)

    @property
    def can_push_weights(self) -> bool:
        """Can weights be loaded between two tokens of a generating batch (partial rollouts)?"""
        return hasattr(self.engine, "push_weights")

    def push_weights(self, version: int, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Partial rollouts: load weights between two tokens of the batch generating now (it goes
        on under them), or at once when none is; returns when they are in, raises why they could
        not be loaded. For engines with `push_weights` (TransformersEngine, VLLMEngine:
        weight_pushes.py); others load them between batches (with_weights_locked)."""
        push = getattr(self.engine, "push_weights", None)
        if push is None:

            def load(engine: InferenceEngine) -> None:
                engine.update_weights(named_tensors)
                engine.model_version = int(version)

            self.with_weights_locked(load)
            return
        done = push(version, named_tensors)
        while not done.wait(0.01):
            if self._lock.acquire(blocking=False):  # no batch generating: load them here
                try:
                    with contextlib.suppress(Exception):  # a failed load is the push's error, raised below
                        self.engine.apply_pending_weights()  # type: ignore[attr-defined]
                finally:
                    self._lock.release()
        if done.error is not None:
            raise done.error

    async def push_weights_async(self, version: int, named_tensors: Iterable[tuple[str, Any]]) -> None:
        await asyncio.to_thread(self.push_weights, version, named_tensors)

    async def score_async(self, sequences: list[list[int]], temperature: float = 1.0) -> list[np.ndarray]:
        """Teacher logprobs of whole sequences (InferenceEngine.score_batch), between generation batches."""
        return await asyncio.to_thread(
            self.with_weights_locked, lambda engine: engine.score_batch(sequences, temperature)
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout=30)
            self.engine.close()

    # --- worker thread -------------------------------------------------------------------------

    def _drain(self, first: _Request) -> list[_Request]:
        pending = [first]
        while True:
            try:
                item = (
                    self._queue.get(timeout=self.gather_s) if self.gather_s > 0 else self._queue.get_nowait()
                )
            except queue.Empty:
                return pending
            if item is None:
                self._queue.put(None)  # keep the stop signal for the loop
                return pending
            pending.append(item)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            pending = self._drain(first)
            groups: dict[tuple[Any, ...], list[_Request]] = {}
            for request in pending:
                if request.future.set_running_or_notify_cancel():
                    groups.setdefault(request.params.batch_key, []).append(request)
            for requests in groups.values():
                self._run_group(requests)

    def _run_group(self, requests: list[_Request]) -> None:
        """Expand n into separate sequences so requests with different n still share a batch."""
        flat: list[list[int]] = []
        owners: list[tuple[int, int]] = []  # (request index, prompt index) per flat row
        sinks: list[tuple[TokenSink, int] | None] = []  # (the request's on_token, its row) per flat row
        for r_idx, request in enumerate(requests):
            for p_idx, prompt in enumerate(request.prompts):
                for k in range(request.params.n):
                    flat.append(prompt)
                    owners.append((r_idx, p_idx))
                    sink = request.on_token
                    sinks.append(None if sink is None else (sink, p_idx * request.params.n + k))
        params = replace(requests[0].params, n=1)
        try:
            outputs: list[GenerationOutput] = []
            for start in range(0, len(flat), self.max_batch_size):
                chunk = flat[start : start + self.max_batch_size]
                extra = self._streaming(sinks[start : start + self.max_batch_size])
                t0 = time.perf_counter()
                with self._lock:
                    results = self.engine.generate_batch(chunk, params, **extra)
                outputs.extend(r[0] for r in results)
                seconds = time.perf_counter() - t0
                generated = sum(int(r[0].response_ids.shape[0]) for r in results)
                self.stats.busy_s += seconds
                self.stats.batches += 1
                self.stats.sequences += len(chunk)
                self.stats.generated_tokens += generated
                if self.log_requests:
                    self._log_batch(len(requests), chunk, params, generated, seconds)
        except BaseException as exc:  # noqa: BLE001 - delivered to every waiting caller
            for request in requests:
                request.future.set_exception(exc)
            return
        per_request: list[list[list[GenerationOutput]]] = [[[] for _ in r.prompts] for r in requests]
        for (r_idx, p_idx), output in zip(owners, outputs, strict=True):
            per_request[r_idx][p_idx].append(output)
        for request, result in zip(requests, per_request, strict=True):
            request.future.set_result(result)

    def _streaming(self, sinks: list[tuple[TokenSink, int] | None]) -> dict[str, Any]:
        """generate_batch's `on_token` for one batch: each row's tokens to its request's sink."""
        if not self.engine.streams or all(s is None for s in sinks):
            return {}

        def on_token(row: int, token_id: int, logprob: float) -> None:
            target = sinks[row]
            if target is None:
                return
            try:
                target[0](target[1], token_id, logprob)
            except Exception:  # noqa: BLE001 - one listener's fault must not fail the batch it shares
                log.exception("engine_token_sink_failed", engine=self.name)

        return {"on_token": on_token}

    def _log_batch(
        self, requests: int, chunk: list[list[int]], params: SamplingParams, generated: int, seconds: float
    ) -> None:
        log.info(
            "engine_requests",
            engine=self.name,
            requests=requests,
            sequences=len(chunk),
            prompt_tokens=sum(len(p) for p in chunk),
            generated_tokens=generated,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=params.max_tokens,
            seconds=round(seconds, 3),
        )


class EnginePool:
    """engine_num batching engines; runner slot i uses engine i % engine_num."""

    def __init__(self, engines: list[BatchingEngine]) -> None:
        if not engines:
            raise InvalidArgument("at least one engine is needed", field="explorer.rollout_model.engine_num")
        self.engines = engines

    def __len__(self) -> int:
        return len(self.engines)

    def __getitem__(self, index: int) -> BatchingEngine:
        return self.engines[index]

    def total_stats(self) -> EngineStats:
        total = EngineStats()
        for engine in self.engines:
            total.generated_tokens += engine.stats.generated_tokens
            total.busy_s += engine.stats.busy_s
            total.batches += engine.stats.batches
            total.sequences += engine.stats.sequences
        return total

    def close(self) -> None:
        for engine in self.engines:
            engine.close()
