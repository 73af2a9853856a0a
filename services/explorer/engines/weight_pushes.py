"""Weights pushed into an engine while it generates (partial rollouts), waiting for a token boundary.

The pusher (BatchingEngine.push_weights, on the explorer's loading thread) queues a version and
waits on the push; the engine's generation loop, between two tokens of its batch, loads the queued
versions in order through the engine's own `update_weights` (so a vLLM engine validates them and
resets its prefix cache as for any update) and stamps the engine with each version. With no batch
generating, the pusher loads them itself under the engine's lock. Both engines (transformers_engine.py,
vllm_engine.py) hold one of these; their loops differ only in how they rebuild the KV cache after it.

A load that fails fails its push and every push queued after it: each pusher sees the error
(WeightPush.error, raised by BatchingEngine.push_weights) instead of waiting forever, and the
generating batch fails with it too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, Protocol


class Loadable(Protocol):
    """What a push needs of an engine (InferenceEngine)."""

    model_version: int

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None: ...


class WeightPush(threading.Event):
    """One pushed version: set once it is loaded, or once its load failed (`error`)."""

    def __init__(self, version: int, tensors: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.version = version
        self.tensors = tensors
        self.error: BaseException | None = None

    def done(self, error: BaseException | None = None) -> None:
        self.error = error
        self.tensors = []  # the engine holds its own copy now; free the pusher's
        self.set()


class WeightPushes:
    """The queue of pushed versions of one engine; thread-safe (pusher and engine threads)."""

    def __init__(self) -> None:
        self._queue: list[WeightPush] = []
        self._lock = threading.Lock()

    def push(self, version: int, named_tensors: Iterable[tuple[str, Any]]) -> WeightPush:
        """Queue `version`; the returned event is set once it is loaded (or failed)."""
        push = WeightPush(int(version), list(named_tensors))
        with self._lock:
            self._queue.append(push)
        return push

    @property
    def pending(self) -> bool:
        """Are pushed weights waiting for the next token boundary?"""
        with self._lock:
            return bool(self._queue)

    def apply(self, engine: Loadable) -> bool:
        """Load the queued versions into `engine` in push order (the newest last), each setting
        engine.model_version; True when weights changed. A failed load is raised after failing its
        push and the later ones; the versions before it stay loaded."""
        with self._lock:
            queued, self._queue = self._queue, []
        for index, push in enumerate(queued):
            try:
                engine.update_weights(push.tensors)
            except BaseException as exc:
                for failed in queued[index:]:
                    failed.done(exc)
                raise
            engine.model_version = push.version
            push.done()
        return bool(queued)


class TakesPushes:
    """The partial-rollout interface of an engine (BatchingEngine.push_weights): mixed into
    TransformersEngine and VLLMEngine, whose generation loops call apply_pending_weights between two
    tokens (vLLM: between two steps, with no request running). The engine sets `self.pushes`."""

    pushes: WeightPushes

    def push_weights(self, version: int, named_tensors: Iterable[tuple[str, Any]]) -> WeightPush:
        """Queue weights to load at the generating batch's next boundary; the event is set once they
        are in. With no batch generating, the caller loads them with apply_pending_weights under the
        engine's lock (BatchingEngine.push_weights)."""
        return self.pushes.push(version, named_tensors)

    @property
    def pending_weights(self) -> bool:
        """Are pushed weights waiting for the next boundary?"""
        return self.pushes.pending

    def apply_pending_weights(self) -> bool:
        """Load the queued weights, if any (update_weights, the newest last); True when weights changed."""
        return self.pushes.apply(self)  # type: ignore[arg-type]
