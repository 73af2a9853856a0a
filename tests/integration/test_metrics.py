"""Prometheus metrics of real service processes: `python -m services.<name>` with
`services.<name>.metrics_port` set, called through the real clients on loopback, then scraped over
HTTP as Prometheus does and read with prometheus_client's parser.

Checked: every RPC counted by method and status code (OK, NOT_FOUND, FAILED_PRECONDITION,
CANCELLED) with its latency; the buffer's depth, leases and row counters equal to what was written,
read and acked; the synchronizer's version lag per explorer; process memory; a metrics port already
taken stops the service with an error naming the key. The trainer's and explorer's step figures, in
whole runs: tests/integration/test_deploy_commands.py.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest
import yaml

from services.buffer.client import BufferClient
from services.common import errors
from services.common.experience import Experience
from services.common.procs import free_port, start_service, stop_process, wait_healthy
from services.synchronizer.client import SynchronizerClient
from services.synchronizer.ledger import FileEntry
from tests.integration.prometheus_page import families, samples, value

BUFFER = "trinity_grpc.buffer.v1.BufferService"
SYNC = "trinity_grpc.synchronizer.v1.SynchronizerService"


def experience(i: int) -> Experience:
    return Experience(
        tokens=np.arange(6, dtype=np.int32),
        prompt_length=2,
        model_version=0,
        reward=1.0,
        logprobs=np.full(4, -0.5, np.float32),
        task_id=f"t{i}",
    )


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
        assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/plain")
        return str(reply.read().decode())


def handled(page: dict, service: str, method: str, code: str, rpc_type: str = "unary") -> float | None:
    labels = {"grpc_service": service, "grpc_method": method, "grpc_type": rpc_type}
    return value(page, "grpc_server_handled_total", **labels, grpc_code=code)


def write_config(tmp, service: str, port: int, metrics_port: int, extra: dict | None = None):  # type: ignore[no-untyped-def]
    data = {
        "checkpoint_root_dir": str(tmp / "runs"),
        "services": {service: {"port": port, "metrics_port": metrics_port}, "shutdown_grace_s": 3},
        **(extra or {}),
    }
    path = tmp / f"{service}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


async def start(tmp, service: str, config, port: int) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
    proc = start_service(service, str(config), log_path=str(tmp / f"{service}.log"))
    try:
        await wait_healthy(f"127.0.0.1:{port}", timeout=60, alive=lambda: proc.poll() is None)
    except BaseException:
        stop_process(proc, timeout=5)
        raise
    return proc


@pytest.fixture(scope="module")
def buffer(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("buffer-metrics")
    port, metrics_port = free_port(), free_port()
    buffers = {"trainer_input": {"experience_buffer": {"name": "exp", "storage_type": "queue"}}}
    config = write_config(
        tmp, "buffer", port, metrics_port, {"buffer": {"data_dir": str(tmp / "data"), **buffers}}
    )
    proc = asyncio.run(start(tmp, "buffer", config, port))
    yield f"127.0.0.1:{port}", metrics_port
    assert stop_process(proc, timeout=10) == 0


async def test_buffer_counts_each_rpc_by_status_and_exports_depth_and_leases(buffer) -> None:
    address, metrics_port = buffer
    async with await BufferClient.connect(address, timeout=10) as client:
        assert (await client.write("exp", [experience(i) for i in range(5)])).written == 5
        batch = await client.read("exp", 2, max_wait=0, lease_s=60)
        assert len(batch.experiences) == 2
        with pytest.raises(errors.NotFound):
            await client.stats("no_such_buffer")
        page = samples(await asyncio.to_thread(scrape, metrics_port))
        assert handled(page, BUFFER, "Write", "OK") == 1 and handled(page, BUFFER, "Read", "OK") == 1
        assert handled(page, BUFFER, "Stats", "NOT_FOUND") == 1 and handled(page, BUFFER, "Stats", "OK") == 0
        write = {"grpc_service": BUFFER, "grpc_method": "Write", "grpc_type": "unary"}
        assert value(page, "grpc_server_started_total", **write) == 1
        assert value(page, "grpc_server_handling_seconds_count", **write) == 1
        assert 0 < value(page, "grpc_server_handling_seconds_sum", **write) < 10
        assert value(page, "grpc_server_handling_seconds_bucket", **write, le="+Inf") == 1
        # declared before its first call, typed by its streaming
        assert handled(page, BUFFER, "StreamRead", "OK", "server_stream") == 0
        # 5 written, 2 of them under one lease: 3 readable
        assert value(page, "trinity_buffer_depth", buffer="exp", kind="fifo") == 3
        assert value(page, "trinity_buffer_leases_outstanding", buffer="exp") == 1
        assert value(page, "trinity_buffer_leased_rows", buffer="exp") == 2
        assert value(page, "trinity_buffer_rows_total", buffer="exp", event="written") == 5
        assert value(page, "trinity_buffer_rows_total", buffer="exp", event="read") == 2
        assert value(page, "trinity_buffer_rows_total", buffer="exp", event="acked") == 0
        assert value(page, "process_resident_memory_bytes") > 10 * 2**20
        assert value(page, "trinity_service_info", service="buffer", version="0.1.0") == 1

        assert await client.ack(batch.lease_id) == 2
        page = samples(await asyncio.to_thread(scrape, metrics_port))
        assert value(page, "trinity_buffer_leases_outstanding", buffer="exp") == 0
        assert value(page, "trinity_buffer_rows_total", buffer="exp", event="acked") == 2
        assert value(page, "trinity_buffer_depth", buffer="exp", kind="fifo") == 3
        assert handled(page, BUFFER, "Ack", "OK") == 1
        assert handled(page, BUFFER, "Write", "OK") == 1  # scrapes are not RPCs


async def test_a_call_the_client_gives_up_on_is_counted_cancelled(buffer) -> None:
    address, metrics_port = buffer
    async with await BufferClient.connect(address, timeout=10) as client:
        assert await client.create_buffer("empty", "fifo")
        waiting = asyncio.create_task(client.read("empty", 1, max_wait=30))
        await asyncio.sleep(0.5)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(50):  # the server sees the cancellation a moment later
            page = samples(await asyncio.to_thread(scrape, metrics_port))
            if handled(page, BUFFER, "Read", "CANCELLED"):
                break
            await asyncio.sleep(0.1)
        assert handled(page, BUFFER, "Read", "CANCELLED") == 1
        assert value(page, "trinity_buffer_depth", buffer="empty", kind="fifo") == 0


def test_only_get_metrics_is_served(buffer) -> None:
    _, metrics_port = buffer
    with pytest.raises(urllib.error.HTTPError) as info:
        scrape(metrics_port, "/")
    assert info.value.code == 404
    request = urllib.request.Request(f"http://127.0.0.1:{metrics_port}/metrics", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 405
    page = scrape(metrics_port)
    assert {"grpc_server_handled", "trinity_buffer_depth", "process_resident_memory_bytes"} <= families(page)


async def test_synchronizer_exports_version_lag_per_explorer_and_counts_refusals(tmp_path) -> None:
    port, metrics_port = free_port(), free_port()
    sync = {"synchronizer": {"sync_method": "checkpoint", "sync_interval": 1, "sync_timeout": 10}}
    proc = await start(
        tmp_path, "synchronizer", write_config(tmp_path, "synchronizer", port, metrics_port, sync), port
    )
    address = f"127.0.0.1:{port}"
    trainer = await SynchronizerClient.connect(address)
    explorer = await SynchronizerClient.connect(address)
    try:
        await trainer.register("trainer", "trainer")
        await explorer.register("explorer-a", "explorer")
        files = (FileEntry("model.safetensors", 1, sha256="0" * 64),)
        for version in (1, 2):
            await trainer.begin_trainer_step(version)
            await trainer.end_trainer_step(version)
            await trainer.publish_version(version, str(tmp_path / f"global_step_{version}"), files)
        with pytest.raises(errors.FailedPrecondition):
            await trainer.publish_version(1, str(tmp_path / "global_step_1b"), files)
        page = samples(await asyncio.to_thread(scrape, metrics_port))
        assert value(page, "trinity_sync_latest_version") == 2
        assert value(page, "trinity_sync_version_lag", member="explorer-a") == 2  # it holds version 0
        assert value(page, "trinity_sync_members", role="trainer", state="alive") == 1
        assert value(page, "trinity_sync_members", role="explorer", state="alive") == 1
        assert value(page, "trinity_sync_member_steps", member="trainer", role="trainer") == 2
        assert handled(page, SYNC, "Register", "OK") == 2 and handled(page, SYNC, "PublishVersion", "OK") == 2
        assert handled(page, SYNC, "PublishVersion", "FAILED_PRECONDITION") == 1

        await explorer.report_sync(2, ok=True)  # it loaded version 2
        page = samples(await asyncio.to_thread(scrape, metrics_port))
        assert value(page, "trinity_sync_version_lag", member="explorer-a") == 0
    finally:
        await trainer.close()
        await explorer.close()
        assert stop_process(proc, timeout=10) == 0


def test_a_metrics_port_in_use_stops_the_service_naming_the_key(tmp_path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = free_port()
        config = write_config(tmp_path, "buffer", port, taken.getsockname()[1])
        log = tmp_path / "buffer.log"
        proc = start_service("buffer", str(config), log_path=str(log))
        try:
            assert proc.wait(60) == 1
        finally:
            stop_process(proc, timeout=5)
    finally:
        taken.close()
    text = log.read_text()
    assert "cannot serve metrics on 127.0.0.1:" in text and "services.buffer.metrics_port" in text
