"""The checks of benchmarks/serve_load.py after the pair stopped: every committed session is in the
buffer exactly once, as the responses its agent got, and the counters add up.

The buffer is a `storage_type: sql` table (rows stay after the trainer acks them): its file is
read directly, read-only, each row decoded from the protobuf bytes the proxy wrote. A row names
its session (`info.session_id`) and the responses of its chain (`info.response_ids`).
"""

from __future__ import annotations

import pathlib
import sqlite3
from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    session_id: str
    response_ids: tuple[str, ...]
    group_id: str
    model_version: int


def buffer_rows(path: pathlib.Path) -> list[Row]:
    """Every experience in the buffer file, in arrival order."""
    from services.common.wire import experience_from_proto
    from trinity_grpc.common.v1 import common_pb2 as pb

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        query = "SELECT p.payload FROM items AS i JOIN payloads AS p ON p.id = i.id ORDER BY i.id"
        payloads = [bytes(r[0]) for r in conn.execute(query)]
    finally:
        conn.close()
    rows = []
    for data in payloads:
        exp = experience_from_proto(pb.Experience.FromString(data))
        info = exp.info or {}
        rows.append(
            Row(
                str(info.get("session_id")),
                tuple(info.get("response_ids", ())),
                exp.group_id,
                exp.model_version,
            )
        )
    return rows


def audit(
    acked: dict[str, list[str]], rows: list[Row], stage: dict[str, Any], failures: list[str]
) -> tuple[list[str], dict[str, Any]]:
    """(problems, figures). `acked`: session -> response ids, for each /commit answered 200;
    `stage`: the pair's summary.json entry (experiences, and the proxy's counters under `serve`)."""
    problems = [f"request failed: {f}" for f in failures[:20]]
    seen = Counter(r.session_id for r in rows)
    doubled = sorted(s for s, n in seen.items() if n > 1)
    missing = sorted(set(acked) - set(seen))
    unasked = sorted(set(seen) - set(acked))
    wrong = [
        r.session_id for r in rows if r.session_id in acked and list(r.response_ids) != acked[r.session_id]
    ]
    for what, ids in (
        ("in the buffer more than once", doubled),
        ("committed (acknowledged) but not in the buffer", missing),
        ("in the buffer but never acknowledged", unasked),
        ("in the buffer with other responses than its agent got", wrong),
    ):
        if ids:
            problems.append(f"{len(ids)} sessions {what}: {ids[:5]}")
    counts = stage.get("experiences") or {}
    serve = stage.get("serve") or {}
    dropped = sum((counts.get("dropped") or {}).values())
    if not counts or not serve:
        problems.append(f"summary.json has no counters for the stage: {sorted(stage)}")
    else:
        sums = counts["trained"] + counts["buffered"] + dropped
        if counts["written"] != sums:
            problems.append(f"written {counts['written']} != trained + buffered + dropped = {sums}: {counts}")
        for name, value in (
            ("buffer written", counts["written"]),
            ("proxy experiences_written", serve.get("experiences_written", 0)),
            ("proxy experiences_committed", serve.get("experiences_committed", 0)),
        ):
            if value != len(rows):
                problems.append(f"{name} is {value}, but the buffer holds {len(rows)} rows")
        for name in ("sessions_expired", "chains_unrewarded", "splits"):
            if serve.get(name, 0):
                problems.append(
                    f"the proxy counted {serve[name]} {name} (agents commit every session, whole)"
                )
    figures = {
        "sessions_acknowledged": len(acked),
        "buffer_rows": len(rows),
        "versions_in_buffer": len({r.model_version for r in rows}),
        "experiences": counts,
        "proxy_counters": serve,
    }
    return problems, figures
