"""What the synchronizer exports to Prometheus (docs/metrics.md), read from its ledger at each scrape."""

from __future__ import annotations

from services.common.metrics import Samples, ServiceMetrics
from services.synchronizer.core import Synchronizer


def export(metrics: ServiceMetrics, core: Synchronizer) -> None:
    """Register the synchronizer's gauges on `metrics`; they read `core`'s ledger when scraped."""

    def latest() -> Samples:
        return {(): float(core.ledger.latest.version)}

    def lag() -> Samples:
        newest = core.ledger.latest.version
        return {(m.member_id,): float(max(0, newest - m.held)) for m in core.ledger.explorers()}

    def members() -> Samples:
        counts: dict[tuple[str, ...], float] = {}
        for m in core.ledger.members.values():
            key = (m.role, "alive" if m.alive else "dead")
            counts[key] = counts.get(key, 0.0) + 1
        return counts

    def steps() -> Samples:
        return {(m.member_id, m.role): float(m.step) for m in core.ledger.members.values()}

    metrics.read_gauges(
        "trinity_sync_latest_version", "The newest weight version the trainer published.", (), latest
    )
    metrics.read_gauges(
        "trinity_sync_version_lag",
        "Versions a live explorer is behind the newest published one (latest - the version it holds).",
        ("member",),
        lag,
    )
    metrics.read_gauges(
        "trinity_sync_members", "Registered members by role and liveness.", ("role", "state"), members
    )
    metrics.read_gauges(
        "trinity_sync_member_steps",
        "Steps each member has completed, as its last call told the synchronizer.",
        ("member", "role"),
        steps,
    )
