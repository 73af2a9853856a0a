"""deploy/systemd started by systemd: a container with systemd as PID 1 (never the host's), the units
installed with the commands of docs/deploy.md, run verbatim.

The image is trinity-grpc:cpu (the package in /opt/trinity-grpc/.venv, where the units expect it)
with systemd as its command (tests/deploy/systemd.Dockerfile). The repo's deploy/ is copied to
/opt/trinity-grpc/deploy, with the example config's run made long enough to outlast the tests; then
every command of the docs' systemd block runs in it (`sudo` dropped: the shell is root; the clone,
`make setup` and `journalctl -f` lines skipped).
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.deploy.stack import REPO, run, wait_until, write_long_run

UNITS = [f"trinity-grpc@{name}" for name in ("buffer", "synchronizer", "trainer", "explorer")]
PORTS = {"buffer": 50051, "synchronizer": 50052, "trainer": 50053, "explorer": 50054}
# systemd as PID 1 in docker (docs/deploy.md, "Testing the deploy files"): every capability but
# CAP_SYS_RESOURCE (the host lacks it), its own cgroup namespace, cgroupfs writable.
SYSTEMD_RUN = [
    "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE", "--security-opt", "seccomp=unconfined",
    "--cgroupns=private", "--tmpfs", "/run", "--tmpfs", "/run/lock",
]  # fmt: skip
BOOT = "mount -o remount,rw /sys/fs/cgroup && mount -o remount,bind,rw /sys/fs/cgroup/systemd && exec /lib/systemd/systemd"


def docs_commands() -> list[str]:
    """The shell commands of docs/deploy.md's systemd block, as root runs them in the container."""
    text = (REPO / "docs" / "deploy.md").read_text()
    block = text.split("## systemd", 1)[1].split("```", 2)[1]
    commands, pending = [], ""
    for line in block.splitlines():
        line = line.strip()
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line, pending = pending + line, ""
        if not line or line.startswith("#") or "git clone" in line or "journalctl" in line:
            continue
        line = re.sub(r"\bsudo -u (\S+) ", r"runuser -u \1 -- ", line)
        commands.append(re.sub(r"\bsudo ", "", line))
    return commands


def long_run_files(root: pathlib.Path) -> pathlib.Path:
    """A copy of deploy/ whose example config and taskset run for hundreds of steps."""
    deploy = root / "deploy"
    shutil.copytree(REPO / "deploy", deploy, ignore=shutil.ignore_patterns("wheelhouse"))
    config_path = deploy / "systemd" / "config.yaml"
    write_long_run(config_path, config_path, deploy / "compose" / "data" / "tasks.jsonl")
    return deploy


class Machine:
    """A container booted with systemd; commands run in it with `docker exec`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def sh(self, command: str, check: bool = True, timeout: float = 300) -> str:
        cmd = ["docker", "exec", "-w", "/opt/trinity-grpc", self.name, "bash", "-ec", command]
        return run(cmd, check=check, timeout=timeout).stdout.strip()

    def show(self, unit: str, prop: str) -> str:
        return self.sh(f"systemctl show -p {prop} --value {unit}")

    def all_active(self) -> bool:
        states = self.sh(f"systemctl is-active {' '.join(UNITS)}", check=False).split()
        return states == ["active"] * len(UNITS)

    def journal(self, unit: str) -> list[dict]:
        """The unit's journal entries (journalctl -o json), MESSAGE parsed when it is a JSON log line."""
        entries = []
        for line in self.sh(f"journalctl -u {unit} -o json --no-pager").splitlines():
            entry = json.loads(line)
            message = entry.get("MESSAGE")
            if isinstance(message, str) and message.startswith("{"):
                entry["log"] = json.loads(message)
            entries.append(entry)
        return entries


@pytest.fixture(scope="module")
def machine(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    tag = "trinity-grpc-systemd:test"
    dockerfile = REPO / "tests" / "deploy" / "systemd.Dockerfile"
    run(
        [
            "docker",
            "build",
            "-q",
            "--build-arg",
            f"IMAGE={image}",
            "-f",
            str(dockerfile),
            "-t",
            tag,
            str(dockerfile.parent),
        ]
    )
    name = f"trinity-grpc-systemd-{uuid.uuid4().hex[:6]}"
    run(["docker", "run", "-d", "--name", name, *SYSTEMD_RUN, tag, "sh", "-c", BOOT])
    machine = Machine(name)
    try:
        wait_until(
            "systemd running in the container",
            lambda: machine.sh("systemctl is-system-running", check=False) in ("running", "degraded"),
            60,
            0.5,
        )
        deploy = long_run_files(tmp_path_factory.mktemp("systemd"))
        run(["docker", "cp", str(deploy), f"{name}:/opt/trinity-grpc/deploy"])
        yield machine
    finally:
        run(["docker", "rm", "-f", name], check=False)


def test_docs_commands_install_and_start_every_unit(machine: Machine) -> None:
    commands = docs_commands()
    assert any("systemctl enable --now trinity-grpc.target" in c for c in commands), commands
    for command in commands:
        if command.startswith("trinity status"):
            # the last step of the docs: every service SERVING once the target is up
            wait_until("every unit active", machine.all_active, 120, 0.5)
        machine.sh(command)
    for unit in UNITS:
        assert machine.show(unit, "ActiveState") == "active", unit
        assert machine.show(unit, "User") == "trinity-grpc"
    for port in PORTS.values():
        machine.sh(f"/opt/trinity-grpc/.venv/bin/trinity health 127.0.0.1:{port}")


def test_training_steps_reach_the_journal_as_structured_json(machine: Machine) -> None:
    def steps() -> list[dict]:
        return [
            e["log"]
            for e in machine.journal("trinity-grpc@trainer")
            if e.get("log", {}).get("event") == "train_step"
        ]

    found = wait_until(
        "train_step lines in the trainer's journal", lambda: len(steps()) >= 3 and steps(), 180
    )
    assert all(s["service"] == "trainer" and s["level"] == "info" for s in found)
    explorer = [e["log"] for e in machine.journal("trinity-grpc@explorer") if "log" in e]
    assert any(e.get("event") == "explore_step" for e in explorer)


def test_a_killed_service_is_restarted_by_systemd(machine: Machine) -> None:
    unit = "trinity-grpc@buffer"
    pid = machine.show(unit, "MainPID")
    assert int(pid) > 0
    machine.sh(f"kill -9 {pid}")
    wait_until(
        "the buffer restarted (Restart=on-failure, RestartSec=5)",
        lambda: machine.show(unit, "NRestarts") == "1" and machine.show(unit, "ActiveState") == "active",
        60,
        0.5,
    )
    assert machine.show(unit, "MainPID") != pid
    machine.sh("/opt/trinity-grpc/.venv/bin/trinity health 127.0.0.1:50051")
    wait_until("every unit active again", machine.all_active, 120, 0.5)


def test_stop_is_clean(machine: Machine) -> None:
    started = time.monotonic()
    # The target is ordered After= its units, so its own stop job ends first and the units then stop
    # in reverse start order (explorer, trainer, synchronizer, buffer last): wait for all of them.
    machine.sh("systemctl stop trinity-grpc.target")
    wait_until(
        "every unit stopped",
        lambda: machine.sh(f"systemctl is-active {' '.join(UNITS)}", check=False).split() == ["inactive"] * 4,
        60,
        0.2,
    )
    took = time.monotonic() - started
    print(f"systemctl stop trinity-grpc.target: {took:.1f} s")
    for unit in UNITS:
        state = {p: machine.show(unit, p) for p in ("ActiveState", "Result", "ExecMainStatus")}
        assert state == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}, (unit, state)
    assert took < 15, f"systemctl stop took {took:.1f} s"
