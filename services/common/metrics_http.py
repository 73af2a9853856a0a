"""`GET /metrics` over HTTP/1.1, served on the service's own event loop (asyncio.start_server).

Not prometheus_client's `start_http_server`, which scrapes from a thread of its own: here a scrape
runs between two awaits of the service, so the collectors that read its state at scrape time
(buffer depths, leases, the synchronizer's ledger) see it whole, with no lock. The text format (or
OpenMetrics, when the scraper asks for it) comes from prometheus_client's own encoders. One request
per connection; a client that sends nothing for READ_TIMEOUT_S is dropped.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from services.common.logging import get_logger

MAX_HEAD_BYTES = 16 * 1024
READ_TIMEOUT_S = 10.0
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Error"}
log = get_logger("metrics")


def respond(head: bytes, registry: CollectorRegistry) -> tuple[int, str, bytes]:
    """(status, content type, body) for the request whose head (request line and headers) is `head`."""
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return 400, "text/plain", b"not an HTTP/1.x request line\n"
    method, target, _ = parts
    if target.partition("?")[0] != "/metrics":
        return 404, "text/plain", b"metrics are served at /metrics\n"
    if method != "GET":
        return 405, "text/plain", b"GET /metrics\n"
    headers = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    encode, content_type = choose_encoder(headers.get("accept", ""))
    return 200, content_type, encode(registry)


class MetricsEndpoint:
    """The HTTP listener of one registry; `start` binds, `close` stops listening."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: a free port); returns the bound port. OSError when it cannot bind."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
                return
            try:
                status, content_type, body = respond(head[:-4], self._registry)
            except Exception as exc:  # a collector failed: the scrape fails, the service goes on
                log.exception("metrics_scrape_failed")
                status, content_type, body = 500, "text/plain", f"collecting failed: {exc!r}\n".encode()
            writer.write(
                f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
                + body
            )
            await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()
