"""Sustained write -> read -> ack rate of ~4 KB experiences through the buffer's gRPC API,
against the raw SQLite insert -> claim -> ack rate of the same rows (stdlib sqlite3, batched
transactions) measured in the same run.

    python benchmarks/buffer_throughput.py [--quick] [--items N]

Ours: a real `python -m services.buffer` process; one writer task (Write of 256, idempotency
keys) and one reader task (Read 256 + Ack) run concurrently through BufferClient, as an
explorer and a trainer would. The fifo has a capacity, so the writer feels backpressure and the
server's memory must stay flat: its RSS is sampled while the items pass through and its peak
(VmHWM) reported. Baseline: the same rows, 256 per transaction: INSERT; UPDATE ... RETURNING
claim; DELETE by lease (each its own transaction, WAL, synchronous=NORMAL) — the limit of the
storage the service is built on. The baseline runs once before and once after the service
(each on a fresh file) and counts as their pooled rate, so a load change on a shared machine
during the run does not favour either side. Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sqlite3
import sys
import tempfile
import time

import numpy as np
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.buffer.client import BufferClient  # noqa: E402
from services.common.experience import Experience  # noqa: E402
from services.common.procs import free_port, start_service, stop_process, wait_healthy  # noqa: E402
from services.common.wire import experience_to_proto  # noqa: E402

BATCH = 256


def make_batch(seed: int) -> list:
    """256 experiences of ~4 KB each: 512 prompt+response int32 tokens, 480 float32 logprobs."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(BATCH):
        e = Experience(
            tokens=rng.integers(0, 150_000, 512, dtype=np.int32),
            prompt_length=32,
            model_version=i % 4,
            reward=float(i % 2),
            logprobs=rng.standard_normal(480).astype(np.float32),
            task_id=f"t{i}",
        )
        out.append(experience_to_proto(e))
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kb(pid: int, key: str = "VmRSS") -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def baseline(rows: list[bytes], items: int, path: str) -> tuple[int, float, float]:
    """Full insert -> claim -> ack cycles with stdlib sqlite3, 256 rows per transaction:
    (items, seconds, CPU seconds)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE items (id INTEGER PRIMARY KEY, state INT, model_version INT, created_at REAL, "
        "lease_id TEXT, lease_expires REAL, payload BLOB)"
    )
    db.execute("CREATE INDEX ix_ready ON items(id) WHERE state = 0")
    db.execute("CREATE INDEX ix_lease ON items(lease_id) WHERE lease_id IS NOT NULL")
    done, n = 0, 0
    cpu0 = time.process_time()
    start = time.perf_counter()
    while done < items:
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO items (state, model_version, created_at, payload) VALUES (0, ?, ?, ?)",
            [(i % 4, now, p) for i, p in enumerate(rows)],
        )
        db.execute("COMMIT")
        lease = f"l{n}"
        db.execute("BEGIN IMMEDIATE")
        got = db.execute(
            "UPDATE items SET state = 1, lease_id = ?, lease_expires = ? WHERE id IN "
            "(SELECT id FROM items WHERE state = 0 ORDER BY id LIMIT ?) RETURNING id, payload",
            (lease, now + 600, BATCH),
        ).fetchall()
        db.execute("COMMIT")
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM items WHERE lease_id = ?", (lease,))
        db.execute("COMMIT")
        done += len(got)
        n += 1
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    db.close()
    return done, elapsed, cpu


async def ours(batches: list[list], items: int, tmp: pathlib.Path) -> dict:
    port = free_port()
    config = tmp / "bench.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "checkpoint_root_dir": str(tmp / "runs"),
                "log": {"level": "WARNING"},
                "services": {"buffer": {"port": port}},
                "buffer": {
                    "data_dir": str(tmp / "data"),
                    "trainer_input": {
                        "experience_buffer": {
                            "name": "bench",
                            "storage_type": "queue",
                            "capacity": 8 * BATCH,
                            "max_read_timeout": 30,
                        }
                    },
                },
            }
        )
    )
    proc = start_service("buffer", str(config), log_path=str(tmp / "buffer.log"))
    rss: list[int] = []
    try:
        await wait_healthy(f"127.0.0.1:{port}", timeout=60, alive=lambda: proc.poll() is None)
        async with await BufferClient.connect(f"127.0.0.1:{port}", timeout=60) as client:
            n_batches = items // BATCH

            async def writer() -> None:
                for i in range(n_batches):
                    await client.write("bench", batches[i % len(batches)], idempotency_key=f"w{i}")

            async def reader() -> int:
                got = 0
                while got < n_batches * BATCH:
                    batch = await client.read("bench", BATCH, max_wait=5, raw=True)
                    got += len(batch.experiences)
                    if batch.lease_id:
                        await client.ack(batch.lease_id)
                    if (got // BATCH) % max(1, n_batches // 10) == 0:
                        rss.append(rss_kb(proc.pid))
                return got

            server_cpu0, client_cpu0 = cpu_s(proc.pid), time.process_time()
            start = time.perf_counter()
            _, got = await asyncio.gather(writer(), reader())
            elapsed = time.perf_counter() - start
            server_cpu, client_cpu = cpu_s(proc.pid) - server_cpu0, time.process_time() - client_cpu0
            stats = await client.stats("bench")
        peak = rss_kb(proc.pid, "VmHWM")
    finally:
        stop_process(proc, timeout=15)
    return {
        "rate": got / elapsed,
        "items": got,
        "elapsed_s": elapsed,
        "peak_rss_mb": peak / 1024,
        "rss_samples_mb": [round(r / 1024, 1) for r in rss],
        "server_cpu_s": server_cpu,
        "client_cpu_s": client_cpu,
        "acked": stats.acked,
        "depth_after": stats.depth,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer items (50k instead of 1M)")
    parser.add_argument("--items", type=int, default=None, help="experiences to pass through the service")
    args = parser.parse_args()
    items = args.items or (50_000 if args.quick else 1_000_000)
    batches = [make_batch(s) for s in range(4)]
    payload_bytes = np.mean([len(m.SerializeToString()) for m in batches[0]])
    rows = [m.SerializeToString() for m in batches[0]]
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = pathlib.Path(tmpdir)
        per_run = min(items, 100_000)
        before = baseline(rows, per_run, str(tmp / "raw-before.sqlite"))
        load_before = os.getloadavg()[0]
        result = asyncio.run(ours(batches, items, tmp))
        load_after = os.getloadavg()[0]
        after = baseline(rows, per_run, str(tmp / "raw-after.sqlite"))
    base = (before[0] + after[0]) / (before[1] + after[1])
    out = {
        "name": "buffer_throughput",
        "unit": "experiences/s (write->read->ack)",
        "ours": round(result["rate"], 1),
        "baseline": round(base, 1),
        "baseline_name": "stdlib sqlite3 insert->claim->ack, 256 rows per transaction, WAL",
        "ratio": round(result["rate"] / base, 3),
        "target_ratio": 0.5,
        "config": {
            "items": result["items"],
            "batch": BATCH,
            "payload_bytes": round(float(payload_bytes)),
            "capacity": 8 * BATCH,
            "quick": args.quick,
            "elapsed_s": round(result["elapsed_s"], 1),
            "peak_rss_mb": round(result["peak_rss_mb"], 1),
            "rss_samples_mb": result["rss_samples_mb"],
            "acked": result["acked"],
            "depth_after": result["depth_after"],
            "baseline_runs": [round(n / t, 1) for n, t, _ in (before, after)],
            # CPU per experience, load-independent: the service (server + client process) vs baseline
            "cpu_us_per_item": {
                "server": round(result["server_cpu_s"] / result["items"] * 1e6, 1),
                "client": round(result["client_cpu_s"] / result["items"] * 1e6, 1),
                "baseline": round((before[2] + after[2]) / (before[0] + after[0]) * 1e6, 1),
            },
            "cpus": os.cpu_count(),
            "loadavg_1m": [round(load_before, 2), round(load_after, 2)],
        },
    }
    (ROOT / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "benchmarks" / "results" / "buffer_throughput.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
