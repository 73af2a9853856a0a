"""Tokens as they are sampled, on the event loop: one BatchingEngine request as an async stream.

The engine thread hands each token to `on_token` (base.py), which posts it to the loop in order;
the end of the tokens is posted after the last one. `outputs()` waits for the engine alone (not for
whoever reads the tokens): the serve proxy holds an engine's weights only that long. An engine that
does not stream yields no tokens, only the outputs: a caller treats both the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from services.explorer.engines.base import BatchingEngine, GenerationOutput, SamplingParams


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token: `row` = prompt index * n + sample index of the request."""

    row: int
    token_id: int
    logprob: float


class TokenStream:
    """Submits one request at construction (on the running loop); iterate it for the tokens."""

    def __init__(self, engine: BatchingEngine, prompts: list[list[int]], params: SamplingParams) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[TokenEvent | None] = asyncio.Queue()
        self._future = engine.submit(prompts, params, self._on_token)
        # posted after the request's last token (the engine thread posts both, in order)
        self._future.add_done_callback(
            lambda _done: self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
        )

    def _on_token(self, row: int, token_id: int, logprob: float) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, TokenEvent(row, token_id, logprob))

    async def outputs(self) -> list[list[GenerationOutput]]:
        """The finished outputs (the same ids and logprobs as the tokens); the engine's error if it failed."""
        return await asyncio.wrap_future(self._future)

    async def tokens(self) -> AsyncIterator[TokenEvent]:
        """Each token as it is sampled, until the request is done (once: the events are consumed)."""
        while (event := await self._queue.get()) is not None:
            yield event
