"""A compose project of deploy/compose brought up for a test: commands, logs, health, gRPC stubs."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time
from collections.abc import Callable
from typing import Any

import grpc
import yaml

from services.common.procs import free_port

REPO = pathlib.Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "compose" / "compose.yaml"
HOST_PORT_VARS = {
    "buffer": "TRINITY_BUFFER_HOST_PORT",
    "synchronizer": "TRINITY_SYNCHRONIZER_HOST_PORT",
    "trainer": "TRINITY_TRAINER_HOST_PORT",
}


def write_long_run(config_from: pathlib.Path, config_to: pathlib.Path, tasks_to: pathlib.Path) -> None:
    """A layout's example config made to run for hundreds of steps (64 tasks, 200 epochs, a checkpoint
    every 5 steps), so that the run outlasts the tests, and its 64 tasks."""
    config = yaml.safe_load(config_from.read_text())
    config["buffer"]["total_epochs"] = 200
    config["trainer"] = {**config.get("trainer", {}), "save_interval": 5}
    config_to.write_text(yaml.safe_dump(config, sort_keys=False))
    tasks = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a in range(8) for b in range(8)]
    tasks_to.write_text("".join(json.dumps(t) + "\n" for t in tasks))


def run(
    cmd: list[str], timeout: float = 300, check: bool = True, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done


def wait_until(what: str, predicate: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    """Poll predicate until it returns a truthy value; fail naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def json_events(text: str) -> list[dict[str, Any]]:
    """structlog JSON lines of `docker compose logs --no-log-prefix` (other lines skipped)."""
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


class Stack:
    """One compose project (its own name, volumes and host ports) over deploy/compose/compose.yaml."""

    def __init__(self, project: str, override: pathlib.Path) -> None:
        self.project = project
        self.override = override
        self.ports = {name: free_port() for name in HOST_PORT_VARS}
        self.env = {**os.environ, **{var: str(self.ports[name]) for name, var in HOST_PORT_VARS.items()}}

    def compose(
        self, *args: str, timeout: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [
            "docker",
            "compose",
            "-p",
            self.project,
            "-f",
            str(COMPOSE_FILE),
            "-f",
            str(self.override),
            *args,
        ]
        return run(cmd, timeout=timeout, check=check, env=self.env)

    def address(self, service: str) -> str:
        return f"127.0.0.1:{self.ports[service]}"

    def container(self, service: str) -> str:
        return self.compose("ps", "-a", "-q", service).stdout.strip()

    def state(self, service: str) -> dict[str, Any]:
        out = run(["docker", "inspect", "--format", "{{json .State}}", self.container(service)]).stdout
        return json.loads(out)

    def healthy(self, service: str) -> bool:
        state = self.state(service)
        return bool(state["Running"]) and state.get("Health", {}).get("Status") == "healthy"

    def events(self, service: str) -> list[dict[str, Any]]:
        return json_events(self.compose("logs", "--no-log-prefix", "--no-color", service).stdout)

    def channel(self, service: str) -> grpc.Channel:
        return grpc.insecure_channel(self.address(service))
