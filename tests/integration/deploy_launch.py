"""The deploy artifacts' commands run as real processes (tests/integration/test_deploy_commands.py):
a sandbox standing in for the machine or container an artifact describes, a launched command, and
the start / health / step / stop sequence every layout goes through."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import urllib.request

import yaml

from services.common.config.services import ServicesConfig
from services.common.errors import TrinityError
from services.common.health import check_health, wait_healthy
from services.common.procs import free_port, stop_process

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VENV_BIN = pathlib.Path(sys.executable).parent
SERVICES = ("buffer", "synchronizer", "trainer", "explorer")
DEFAULT_PORTS = {"buffer": 50051, "synchronizer": 50052, "trainer": 50053, "explorer": 50054}
MAPPED_ROOTS = ("/etc/trinity-grpc", "/var/lib/trinity-grpc", "/var/cache/trinity-grpc")
RUNNABLE = ("buffer", "synchronizer")  # in every layout
WORKERS = ("trainer", "explorer")  # in the systemd and compose layouts, after RUNNABLE is healthy
# Long enough that trainer and explorer are mid-job when SIGTERM comes (4 tasks, batch 4: a step an epoch).
STACK_OVERRIDES = {"buffer": {"total_epochs": 1000}}


# --- a sandbox that stands in for the machine/container the artifact describes -------------------


class Sandbox:
    """Temp root for the artifact's absolute paths, plus the artifact's config with free ports."""

    def __init__(
        self, tmp: pathlib.Path, config_text: str, files: dict[str, str], overrides: dict | None = None
    ) -> None:
        self.root = tmp / "root"
        data = yaml.safe_load(config_text)
        for section, values in (overrides or {}).items():
            data.setdefault(section, {}).update(values)
        self.port_map: dict[int, int] = {}
        self.metrics_ports: dict[str, int] = {}  # services whose config serves /metrics: the free port
        for name in SERVICES:
            endpoint = data.setdefault("services", {}).setdefault(name, {})
            old = int(endpoint.get("port", DEFAULT_PORTS[name]))
            self.port_map[old] = free_port()
            endpoint.update(host="127.0.0.1", bind=None, port=self.port_map[old])
            if endpoint.get("metrics_port") is not None:
                self.metrics_ports[name] = self.port_map[int(endpoint["metrics_port"])] = free_port()
                endpoint["metrics_port"] = self.metrics_ports[name]
        self.ports = {name: data["services"][name]["port"] for name in SERVICES}
        for path, text in files.items():
            self.write(path, text)
        self.config = self.write(
            "/etc/trinity-grpc/config.yaml", self.map_text(yaml.safe_dump(data, sort_keys=False))
        )
        self.config_data = data

    def write(self, path: str, text: str) -> pathlib.Path:
        target = pathlib.Path(self.map_text(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target

    def map_text(self, text: str) -> str:
        for root in MAPPED_ROOTS:
            text = text.replace(root, f"{self.root}{root}")
        return text.replace("/opt/trinity-grpc/.venv/bin/", f"{VENV_BIN}/")

    def map_port(self, address: str) -> str:
        host, _, port = address.rpartition(":")
        return f"{host}:{self.port_map.get(int(port), int(port))}"

    def argv(self, argv: list[str]) -> list[str]:
        out = [self.map_text(arg) for arg in argv]
        if out and "/" not in out[0] and (VENV_BIN / out[0]).exists():
            out[0] = str(VENV_BIN / out[0])
        return out

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {key: self.map_text(value) for key, value in env.items()}


@dataclasses.dataclass
class Launch:
    """One command of one artifact, run against its sandbox; the fields below the line are outcomes."""

    name: str
    service: str
    sandbox: Sandbox
    argv: list[str]
    env: dict[str, str]
    health_argv: list[str]
    log: pathlib.Path
    notify: socket.socket | None = None
    # ----
    proc: subprocess.Popen[bytes] | None = None
    start_error: str | None = None
    health_before: subprocess.CompletedProcess[str] | None = None
    exit_code: int | None = None
    status_after: str | None = None
    health_after: subprocess.CompletedProcess[str] | None = None
    notified: list[str] = dataclasses.field(default_factory=list)
    steps: int | None = None  # trainers and explorers: GetInfo's step when SIGTERM was sent
    metrics: str | None = None  # its /metrics page just before SIGTERM (None: the config serves none)
    metrics_error: str | None = None  # why that page could not be read

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sandbox.ports[self.service]}"

    def log_tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""


def scrape(launch: Launch) -> None:
    """GET /metrics of the launched service, as Prometheus does, into launch.metrics (or metrics_error)."""
    port = launch.sandbox.metrics_ports.get(launch.service)
    if port is None:
        return
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            launch.metrics = reply.read().decode()
    except OSError as exc:
        launch.metrics_error = f"GET http://127.0.0.1:{port}/metrics: {exc}"


def run_health(launch: Launch) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **launch.env}
    return subprocess.run(
        launch.sandbox.argv(launch.health_argv), capture_output=True, text=True, env=env, timeout=30
    )


def start(launch: Launch) -> None:
    base_env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    env = {**base_env, "PYTHONUNBUFFERED": "1", **launch.env}
    with open(launch.log, "wb") as out:
        launch.proc = subprocess.Popen(
            launch.sandbox.argv(launch.argv),
            env=env,
            cwd=launch.sandbox.root,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def healthy(launch: Launch) -> None:
    proc = launch.proc
    assert proc is not None
    try:
        await wait_healthy(launch.address, 90, alive=lambda: proc.poll() is None)
    except (RuntimeError, TimeoutError) as exc:
        launch.start_error = str(exc)


async def wait_step(launch: Launch, timeout: float = 90) -> None:
    """Wait until the service's GetInfo says step ≥ 1 (a trainer step needs an explorer step's data)."""
    from services.cli.status import service_info

    proc = launch.proc
    assert proc is not None
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline and proc.poll() is None:
        try:
            info = await service_info(launch.service, launch.address, ServicesConfig(), 3)
            launch.steps = int(info.stats.get("step", 0))
            if launch.steps >= 1:
                return
        except TrinityError:
            pass
        await asyncio.sleep(0.5)


async def stop(launches: list[Launch]) -> None:
    for launch in launches:
        assert launch.proc is not None
        if launch.proc.poll() is None:
            launch.proc.send_signal(signal.SIGTERM)
    for launch in launches:
        assert launch.proc is not None
        try:
            launch.exit_code = await asyncio.to_thread(launch.proc.wait, 60)
        except subprocess.TimeoutExpired:
            stop_process(launch.proc, signal.SIGKILL, timeout=5)


async def exercise(launches: list[Launch]) -> None:
    """Start all, wait SERVING, run each artifact's health command, SIGTERM all, probe again.

    In two waves, as systemd's After= and compose's depends_on order them: buffers and synchronizers
    first, then trainers and explorers once those are SERVING; stopped the other way round (a trainer
    that stops flushes its leases to the buffer). Within a wave all at once: the machine is small and
    each start is mostly Python start-up time.
    """
    waves = [
        [la for la in launches if la.service not in WORKERS],
        [la for la in launches if la.service in WORKERS],
    ]
    for wave in waves:
        for launch in wave:
            start(launch)
        await asyncio.gather(*(healthy(launch) for launch in wave))
    serving = [launch for launch in launches if launch.start_error is None]
    results = await asyncio.gather(*(asyncio.to_thread(run_health, launch) for launch in serving))
    for launch, result in zip(serving, results, strict=True):
        launch.health_before = result
    # SIGTERM mid-job, not between jobs: each trainer has trained on its explorer's experiences.
    await asyncio.gather(*(wait_step(la) for la in serving if la.service in WORKERS))
    # What Prometheus would read of each service at that moment.
    await asyncio.gather(*(asyncio.to_thread(scrape, launch) for launch in serving))
    for wave in reversed(waves):
        await stop(wave)
    # Once stopped: the in-process probe for all, the artifact's own command where it is a supervisor's
    # healthcheck (compose) — a Python start-up each, and the machine is small.
    for launch in serving:
        launch.status_after = await check_health(launch.address, timeout=1)
    own = [launch for launch in serving if launch.name.startswith("compose:")]
    results = await asyncio.gather(*(asyncio.to_thread(run_health, launch) for launch in own))
    for launch, result in zip(own, results, strict=True):
        launch.health_after = result
    for launch in launches:
        while launch.notify is not None:
            try:
                launch.notified.append(launch.notify.recv(4096).decode())
            except BlockingIOError:
                break
