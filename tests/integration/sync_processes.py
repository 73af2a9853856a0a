"""The stand-in members' harness for the synchronizer's process tests: a real synchronizer and
stand-in trainer / explorer processes (sync_member.py), their event logs, and what they report."""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import subprocess
import sys
import time

import yaml

from services.common.procs import free_port, start_service, stop_process, wait_healthy

MEMBER = pathlib.Path(__file__).with_name("sync_member.py")


def write_config(tmp_path: pathlib.Path, port: int, **sync: object) -> pathlib.Path:
    cfg = {
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "project": "p",
        "name": "n",
        "services": {"synchronizer": {"host": "127.0.0.1", "port": port}, "call_timeout_s": 20},
        "synchronizer": {"heartbeat_interval_s": 0.3, "member_timeout_s": 3, "bucket_mb": 1, **sync},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Run:
    """The synchronizer and the member processes of one test; everything stopped by PID."""

    def __init__(self, tmp_path: pathlib.Path, **sync: object) -> None:
        self.tmp = tmp_path
        self.port = free_port()
        self.config = write_config(tmp_path, self.port, **sync)
        self.events = tmp_path / "events.jsonl"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    async def start_synchronizer(self) -> None:
        proc = start_service("synchronizer", str(self.config), log_path=str(self.tmp / "synchronizer.log"))
        self.procs["synchronizer"] = proc
        await wait_healthy(f"127.0.0.1:{self.port}", 30, alive=lambda: proc.poll() is None)

    def member(self, role: str, member_id: str, steps: int, *extra: str) -> None:
        cmd = [
            sys.executable,
            str(MEMBER),
            "--config",
            str(self.config),
            "--role",
            role,
            "--member-id",
            member_id,
            "--steps",
            str(steps),
            "--events",
            str(self.events),
            *extra,
        ]
        log = open(self.tmp / f"{member_id}.log", "ab")  # noqa: SIM115 - the child owns it
        self.procs[member_id] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def read(self) -> list[dict]:
        if not self.events.exists():
            return []
        return [json.loads(line) for line in self.events.read_text().splitlines() if line.strip()]

    def of(self, who: str, *events: str) -> list[dict]:
        return [e for e in self.read() if e["who"] == who and (not events or e["event"] in events)]

    async def wait_for(self, predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not predicate():
            for name, proc in self.procs.items():
                if name != "explorer-b" and proc.poll() not in (None, 0):
                    raise AssertionError(f"{name} exited with {proc.returncode}: {self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {self.read()}\n{self.logs()}")
            await asyncio.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.tmp.glob("*.log"))

    def stop(self) -> None:
        for proc in self.procs.values():
            stop_process(proc, signal.SIGTERM, timeout=5)

    def all_done(self, *members: str) -> bool:
        return all(self.of(m, "done") for m in members)

    async def play(self, *members: tuple[str, ...], timeout: float = 90) -> None:
        """Start the synchronizer and each (role, member_id, steps, *extra args) member, then wait until
        every member is done; on any failure the processes are stopped before the error goes on."""
        try:
            await self.start_synchronizer()
            for role, member_id, steps, *extra in members:
                self.member(role, member_id, int(steps), *extra)
            ids = [m[1] for m in members]
            await self.wait_for(lambda: self.all_done(*ids), timeout, "all members to finish")
        except BaseException:  # the caller's finally only guards a run that got this far
            self.stop()
            raise


def versions_of(run: Run, explorer: str) -> tuple[list[int], list[int]]:
    """(version each step ran with, versions loaded), after checking every load and step bit for bit."""
    steps, syncs = run.of(explorer, "step"), run.of(explorer, "sync")
    assert [e["step"] for e in steps] == list(range(1, len(steps) + 1))
    assert all(e["exact"] for e in steps + syncs), steps + syncs
    return [e["version"] for e in steps], [e["version"] for e in syncs]


def trainer_events(run: Run) -> list[str]:
    return [
        f"T{e['step']}" if e["event"] == "train" else f"v{e['version']}"
        for e in run.of("trainer", "train", "publish")
    ]
