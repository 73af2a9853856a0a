"""Stand-ins for the serve-mode proxy's synchronizer side (unit tests of services/explorer/serve)."""

from __future__ import annotations

import asyncio
from typing import Any

from services.synchronizer.client import Decision
from services.synchronizer.ledger import Version


class PlannedSync:
    """A synchronizer client whose plan names `versions[step]` before that step (none otherwise);
    its receiver hands out `weights[version]`. Records what it was told."""

    def __init__(self, versions: dict[int, int], weights: dict[int, dict[str, Any]]) -> None:
        self.versions = versions
        self.weights = weights
        self.step = 0
        self.reports: list[tuple[int, bool]] = []

    async def begin_explorer_step(self, step: int) -> Decision:
        version = self.versions.get(step)
        return Decision(None if version is None else Version(version), "planned")

    async def receive(self, version: Version, into: Any = None) -> dict[str, Any]:
        self.reports.append((version.version, True))
        return self.weights[version.version]

    async def report_sync(self, version: int, ok: bool, error: str = "") -> None:
        self.reports.append((version, ok))


class ByteTokenizer:
    """One token per UTF-8 byte (id = byte value), 256 = EOS: decoding a prefix can end inside a character."""

    eos_token_id = 256

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        eos = "" if skip_special_tokens else "<eos>"
        out, run = [], bytearray()
        for i in ids:
            if i == self.eos_token_id:
                out.append(run.decode(errors="replace") + eos)
                run = bytearray()
            else:
                run.append(i)
        return "".join(out) + run.decode(errors="replace")

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


class RecordingBuffer:
    """An experience buffer client that keeps what it is given: (buffer, idempotency key, rows).
    A write whose key contains one of `held` waits until `release` is set."""

    def __init__(self, held: tuple[str, ...] = ()) -> None:
        self.writes: list[tuple[str, str, int]] = []
        self.held = held
        self.release = asyncio.Event()

    async def write(self, buffer: str, rows: list[Any], *, idempotency_key: str, writer_id: str) -> None:
        if any(h in idempotency_key for h in self.held):
            await self.release.wait()
        self.writes.append((buffer, idempotency_key, len(rows)))
