"""deploy/compose brought up for real: `docker compose up -d --wait`, clients through the published
ports, a training run, `docker kill` of the buffer and the trainer, and `down`.

The stack is deploy/compose/compose.yaml unchanged plus an override that mounts a longer run (64
tasks, many epochs, a checkpoint every 5 steps) instead of the 4-task demo, under its own project
name and host ports. The tests run in file order against one stack: each is one thing a user does.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
import yaml

from tests.deploy.stack import REPO, Stack, run, wait_until, write_long_run
from tests.integration.prometheus_page import samples, value
from trinity_grpc.buffer.v1 import buffer_pb2, buffer_pb2_grpc
from trinity_grpc.common.v1 import common_pb2
from trinity_grpc.synchronizer.v1 import synchronizer_pb2, synchronizer_pb2_grpc

SERVICES = ("buffer", "synchronizer", "trainer", "explorer")


def write_run_files(root: pathlib.Path) -> pathlib.Path:
    """The compose config with a run long enough to outlast the tests, its tasks, and the override."""
    data = root / "data"
    data.mkdir(mode=0o755)
    write_long_run(REPO / "deploy" / "compose" / "config.yaml", root / "config.yaml", data / "tasks.jsonl")
    os.chmod(root / "config.yaml", 0o644)
    config_mount = f"{root / 'config.yaml'}:/etc/trinity-grpc/config.yaml:ro"
    override = {
        "services": {
            name: {
                "volumes": [config_mount]
                + ([f"{data}:/var/lib/trinity-grpc/data:ro"] if name == "buffer" else [])
            }
            for name in SERVICES
        }
    }
    path = root / "compose.test.yaml"
    path.write_text(yaml.safe_dump(override, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def stack(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("compose")
    root.chmod(0o755)
    stack = Stack(f"trinity-grpc-test-{uuid.uuid4().hex[:6]}", write_run_files(root))
    started = time.monotonic()
    try:
        stack.compose("up", "-d", "--wait", "--no-build", "--pull", "never", timeout=600)
        print(f"compose up --wait: {time.monotonic() - started:.1f} s")
        yield stack
    finally:
        logs = stack.compose("logs", "--no-color", check=False).stdout
        (root / "compose.log").write_text(logs)
        stack.compose("down", "-v", "-t", "30", check=False)
        print(f"compose logs kept in {root / 'compose.log'}")


def latest_version(stack: Stack) -> int:
    with stack.channel("synchronizer") as channel:
        stub = synchronizer_pb2_grpc.SynchronizerServiceStub(channel)
        try:
            status = stub.GetStatus(synchronizer_pb2.GetStatusRequest(), timeout=5)
        except Exception:  # noqa: BLE001 - a synchronizer between restarts reads as "no version yet"
            return -1
        return int(status.latest_version.version)


def experience(i: int) -> common_pb2.Experience:
    e = common_pb2.Experience(prompt_length=2, reward=float(i % 2), model_version=1)
    e.tokens.dtype, e.tokens.raw = common_pb2.ELEMENT_TYPE_INT32, struct.pack("<4i", 1, 2, 3 + i, 4)
    e.logprobs.dtype, e.logprobs.raw = common_pb2.ELEMENT_TYPE_FLOAT32, struct.pack("<2f", -0.5, -0.25)
    e.action_mask.dtype, e.action_mask.raw = common_pb2.ELEMENT_TYPE_BOOL, bytes([1, 1])
    e.ids.producer, e.ids.task_id = "deploy-test", f"task-{i}"
    return e


def test_up_wait_brings_every_service_to_healthy(stack: Stack) -> None:
    for name in SERVICES:
        assert stack.healthy(name), f"{name}: {stack.state(name)}"


def test_python_agent_writes_and_reads_back_through_the_published_port(stack: Stack) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'gen'}:{REPO}"}
    agent = REPO / "examples" / "external_agent" / "agent.py"
    out = run(
        [sys.executable, str(agent), "--address", stack.address("buffer"), "--buffer", "py_agent"], env=env
    )
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert (stats["written"], stats["depth"]) == ("3", "3")  # the retried Write stored nothing twice
    with stack.channel("buffer") as channel:
        stub = buffer_pb2_grpc.BufferServiceStub(channel)
        read = stub.Read(
            buffer_pb2.ReadRequest(buffer="py_agent", batch_size=10, reader_id="deploy-test"), timeout=10
        )
        assert sorted(e.reward for e in read.experiences) == [0.0, 1.0, 1.0]
        assert stub.Ack(buffer_pb2.AckRequest(lease_id=read.lease_id), timeout=10).acked == 3


def test_node_agent_writes_and_reads_back_through_the_published_port(stack: Stack) -> None:
    env = {**os.environ, "NODE_PATH": str(REPO / "tools" / "node" / "node_modules")}
    script = REPO / "tests" / "integration" / "node" / "buffer_agent.js"
    out = run(["node", str(script), stack.address("buffer"), "node_agent"], env=env, timeout=60)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["write"]["written"], result["retry"]["duplicate"]) == (3, True)
    assert result["read"] == {"count": 3, "rewards": [1.0, 0.0, 1.0]} and result["ack"]["acked"] == 3


def test_training_runs_through_all_four_services_and_versions_advance(stack: Stack) -> None:
    first = wait_until(
        "a first published version", lambda: latest_version(stack) >= 1 and latest_version(stack), 180
    )
    wait_until(f"versions past {first + 3}", lambda: latest_version(stack) >= first + 3, 180)
    steps = [e for e in stack.events("trainer") if e.get("event") == "train_step"]
    explored = [e for e in stack.events("explorer") if e.get("event") == "explore_step"]
    assert steps and explored and max(e["step"] for e in steps) >= first + 2


# GET /metrics from inside the container, as the Prometheus of compose.monitoring.yaml does in the
# project network (its image is not pulled here).
SCRAPE = (
    "import sys, urllib.request; "
    "sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:%d/metrics', timeout=10).read().decode())"
)


def test_buffer_metrics_count_the_agents_and_the_trainers_calls(stack: Stack) -> None:
    config = yaml.safe_load((REPO / "deploy" / "compose" / "config.yaml").read_text())
    port = config["services"]["buffer"]["metrics_port"]
    page = samples(stack.compose("exec", "-T", "buffer", "python", "-c", SCRAPE % port).stdout)
    # the Python agent wrote 3 rows to py_agent (its retried Write stored nothing twice), read and acked them
    assert value(page, "trinity_buffer_rows_total", buffer="py_agent", event="written") == 3
    assert value(page, "trinity_buffer_rows_total", buffer="py_agent", event="acked") == 3
    assert value(page, "trinity_buffer_depth", buffer="py_agent", kind="fifo") == 0
    service = "trinity_grpc.buffer.v1.BufferService"

    def handled(method: str) -> float:
        labels = {"grpc_service": service, "grpc_method": method, "grpc_type": "unary", "grpc_code": "OK"}
        return value(page, "grpc_server_handled_total", **labels) or 0.0

    assert handled("Write") >= 4  # both agents' writes and retries, and the explorer's
    assert handled("Read") >= 2 and handled("Ack") >= 2  # the agents' reads, then the trainer's
    assert value(page, "process_resident_memory_bytes") > 10 * 2**20


def test_buffer_killed_and_restarted_keeps_every_acknowledged_write(stack: Stack) -> None:
    with stack.channel("buffer") as channel:
        stub = buffer_pb2_grpc.BufferServiceStub(channel)
        spec = buffer_pb2.BufferSpec(name="acked_before_kill", kind=buffer_pb2.BUFFER_KIND_FIFO)
        stub.CreateBuffer(buffer_pb2.CreateBufferRequest(spec=spec), timeout=10)
        request = buffer_pb2.WriteRequest(
            buffer="acked_before_kill", idempotency_key="k1", experiences=[experience(i) for i in range(20)]
        )
        assert stub.Write(request, timeout=10).written == 20
    before = latest_version(stack)
    run(["docker", "kill", stack.container("buffer")])
    assert stack.state("buffer")["ExitCode"] == 137
    stack.compose("start", "buffer")
    wait_until("the buffer healthy again", lambda: stack.healthy("buffer"), 120)
    with stack.channel("buffer") as channel:
        stats = buffer_pb2_grpc.BufferServiceStub(channel).Stats(
            buffer_pb2.StatsRequest(buffer="acked_before_kill"), timeout=10
        )
    assert (stats.written, stats.depth) == (20, 20)
    # the run goes on against the restarted buffer (a service that gave up is restarted by compose)
    wait_until(
        f"versions past {before + 2} after the buffer restart",
        lambda: latest_version(stack) >= before + 2,
        240,
    )


def test_trainer_killed_resumes_from_its_last_checkpoint(stack: Stack) -> None:
    wait_until(
        "a trainer checkpoint",
        lambda: any(e.get("event") == "checkpoint_saved" for e in stack.events("trainer")),
        240,
    )
    run(["docker", "kill", stack.container("trainer")])
    saved = [e["step"] for e in stack.events("trainer") if e.get("event") == "checkpoint_saved"]
    killed_at = max(e["step"] for e in stack.events("trainer") if e.get("event") == "train_step")
    stack.compose("start", "trainer")

    def resumed() -> list[dict]:
        return [e for e in stack.events("trainer") if e.get("event") == "resumed"]

    resumed_events = wait_until("the trainer's `resumed` log line", resumed, 240)
    assert resumed_events[-1]["step"] == saved[-1], (resumed_events, saved, killed_at)
    wait_until("the trainer healthy again", lambda: stack.healthy("trainer"), 240)
    wait_until(
        f"training past step {killed_at} after the restart",
        lambda: max(e["step"] for e in stack.events("trainer") if e.get("event") == "train_step") > killed_at,
        240,
    )


def test_stop_is_clean_and_quick(stack: Stack) -> None:
    started = time.monotonic()
    stack.compose("stop", "-t", "30")
    took = time.monotonic() - started
    codes = {name: stack.state(name)["ExitCode"] for name in SERVICES}
    print(f"compose stop: {took:.1f} s, exit codes {codes}")
    assert took < 15, f"compose stop took {took:.1f} s"
    # SIGTERM handled by every server (no SIGKILL after the stop timeout: that would be 137)
    assert set(codes.values()) == {0}, codes
