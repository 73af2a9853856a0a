"""What the buffer exports to Prometheus (docs/metrics.md), read at each scrape from the in-memory
mirror of every experience buffer (kinds/item_store.py): the figures GetInfo and Stats give, no query."""

from __future__ import annotations

from services.buffer.core import BufferCore
from services.buffer.kinds.items import ItemBuffer
from services.common.metrics import Samples, ServiceMetrics

ROW_EVENTS = ("written", "read", "acked", "dropped")


def export(metrics: ServiceMetrics, core: BufferCore) -> None:
    """Register the buffer's gauges and counters on `metrics`; they read `core` when scraped."""

    def items() -> dict[str, ItemBuffer]:
        return {name: b for name, b in core.buffers.items() if isinstance(b, ItemBuffer)}

    def depth() -> Samples:
        return {(name, b.kind): float(b.available()) for name, b in items().items()}

    def leases() -> Samples:
        return {(name,): float(b.held()[0]) for name, b in items().items()}

    def leased_rows() -> Samples:
        return {(name,): float(b.held()[1]) for name, b in items().items()}

    def rows() -> Samples:
        return {(name, e): float(b.m.counters[e]) for name, b in items().items() for e in ROW_EVENTS}

    metrics.read_gauges(
        "trinity_buffer_depth",
        "Experiences a Read could take now (ready and due, plus rows of expired leases), per buffer.",
        ("buffer", "kind"),
        depth,
    )
    metrics.read_gauges(
        "trinity_buffer_leases_outstanding",
        "Leases taken by Reads and neither acked, given back nor expired.",
        ("buffer",),
        leases,
    )
    metrics.read_gauges(
        "trinity_buffer_leased_rows", "Experiences under those leases.", ("buffer",), leased_rows
    )
    metrics.read_counters(
        "trinity_buffer_rows",
        "Experiences written, read, acked and dropped over the buffer file's life (kept across restarts).",
        ("buffer", "event"),
        rows,
    )
