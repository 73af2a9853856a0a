"""The serve + train pair of benchmarks/serve_load.py, as a user runs it, and its SIGKILL drills.

`trinity run` of a mode-serve config (buffer, synchronizer and the proxy, each a child it
restarts when it dies) and beside it a `mode: train` trainer (`trinity serve trainer -c <run
dir>/config.resolved.yaml --set mode=train`, as `make demo-agent` starts it), which this module
restarts when it dies, as `trinity run` restarts its children (a supervisor's job: systemd, a
container's restart policy). The experience buffer is a `storage_type: sql` table: it keeps every
row after the trainer acks it, so the audit (serve_load_audit.py) can find each one. Stopping:
SIGTERM to the trainer, then Ctrl-C (SIGINT) to `trinity run`, which stops the proxy, writes the
stage's counters to summary.json (written / trained / buffered / dropped, and the proxy's) and
stops the rest.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import yaml

from services.common.config import load_config
from services.common.health import wait_healthy
from services.common.procs import free_port

TRINITY = pathlib.Path(sys.executable).parent / "trinity"
EXPERIENCES = "exp"
SERVICES = ("proxy", "buffer", "trainer")


def pair_config(
    root: pathlib.Path, *, sessions: int, group: int, batch: int, max_tokens: int, save_interval: int
) -> dict[str, Any]:
    """A mode-serve config on the builtin tiny model: GRPO groups of `group` sessions, `batch` groups
    a training step, a version published every step, the proxy on a fixed port (agents keep their
    base_url across its restarts), room for every session's request at once."""
    return {
        "project": "serve-load",
        "name": "pair",
        "mode": "serve",
        "checkpoint_root_dir": str(root / "runs"),
        "model": {
            "model_path": "builtin:tiny-arith",
            "max_prompt_tokens": 64,
            "max_response_tokens": max_tokens,
        },
        "algorithm": {"algorithm_type": "grpo", "repeat_times": group, "optimizer": {"lr": 1e-4}},
        "synchronizer": {"sync_method": "checkpoint", "sync_style": "dynamic_by_trainer", "sync_interval": 1},
        "explorer": {
            "proxy_port": free_port(),
            "service_status_check_interval": 1,
            "serve": {"session_ttl_s": 3600, "max_concurrent_requests": max(64, 2 * sessions)},
        },
        "buffer": {
            "batch_size": batch,
            "trainer_input": {"experience_buffer": {"name": EXPERIENCES, "storage_type": "sql"}},
        },
        "trainer": {"save_interval": save_interval, "read_timeout_s": 2},
        "monitor": {"monitor_type": "none"},
        "services": {
            **{svc: {"port": 0} for svc in ("buffer", "synchronizer", "trainer", "explorer")},
            "shutdown_grace_s": 5,
        },
    }


def service_pids(marker: str, service: str) -> list[int]:
    """PIDs of `python -m services.<service>` processes whose command line mentions `marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            words = [
                w.decode(errors="replace")
                for w in pathlib.Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            ]
        except OSError:
            continue
        if f"services.{service}" in words and any(marker in w for w in words):
            pids.append(int(entry))
    return pids


class Pair:
    """One serve + train pair under `root`; `url` is the proxy's base URL."""

    def __init__(self, root: pathlib.Path, cfg: dict[str, Any]) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.config = root / "config.yaml"
        self.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.run_dir = pathlib.Path(load_config(str(self.config)).run_dir)
        self.url = f"http://127.0.0.1:{cfg['explorer']['proxy_port']}"
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.run: subprocess.Popen[bytes] | None = None
        self.trainer: subprocess.Popen[bytes] | None = None
        self.trainer_starts = 0
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None

    @property
    def resolved(self) -> Any:
        return load_config(str(self.run_dir / "config.resolved.yaml"))

    def log(self, name: str) -> pathlib.Path:
        return self.root / f"{name}.log"

    async def start(self, timeout: float = 180) -> None:
        """`trinity run` until the proxy listens (it writes serve/proxy_url then)."""
        url_file = self.run_dir / "serve" / "proxy_url"
        url_file.unlink(missing_ok=True)
        run = self.run = self._spawn_run()
        deadline = time.monotonic() + timeout
        while not url_file.exists():
            if run.poll() is not None or time.monotonic() > deadline:
                tail = self.log("run").read_text()[-3000:]
                raise RuntimeError(f"the proxy did not start (trinity run exited {run.poll()}):\n{tail}")
            await asyncio.sleep(0.2)

    def _spawn_run(self) -> subprocess.Popen[bytes]:
        with self.log("run").open("ab") as out:
            return subprocess.Popen(
                [str(TRINITY), "run", "-c", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    async def start_trainer(self) -> None:
        """The `mode: train` trainer, restarted whenever it exits until stop()."""
        self._spawn_trainer()
        cfg = self.resolved
        await wait_healthy(cfg.services.trainer.address, 120, alive=lambda: self.trainer.poll() is None)  # type: ignore[union-attr]
        self._watch = asyncio.create_task(self._supervise())

    def _spawn_trainer(self) -> None:
        resolved = str(self.run_dir / "config.resolved.yaml")
        with self.log("trainer").open("ab") as out:
            self.trainer = subprocess.Popen(
                [str(TRINITY), "serve", "trainer", "-c", resolved, "--set", "mode=train"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.trainer_starts += 1

    async def _supervise(self) -> None:
        while not self._stopping:
            await asyncio.sleep(0.2)
            if self.trainer is not None and self.trainer.poll() is not None and not self._stopping:
                self._spawn_trainer()

    async def kill(self, service: str, timeout: float = 120) -> float:
        """SIGKILL `service` (proxy, buffer or trainer); returns the seconds until it serves again."""
        cfg = self.resolved
        if service == "trainer":
            assert self.trainer is not None
            old = [self.trainer.pid]
        else:
            old = service_pids(str(self.run_dir), "explorer" if service == "proxy" else service)
            if len(old) != 1:
                raise RuntimeError(f"expected one {service} process of {self.run_dir}, found {old}")
        killed = time.monotonic()
        os.kill(old[0], signal.SIGKILL)
        while True:
            await asyncio.sleep(0.1)
            assert self.run is not None and self.run.poll() is None, "trinity run exited during a drill"
            if time.monotonic() - killed > timeout:
                raise TimeoutError(f"{service} did not come back within {timeout:.0f}s")
            if service == "trainer":
                if self.trainer is not None and self.trainer.pid != old[0] and self.trainer.poll() is None:
                    await wait_healthy(cfg.services.trainer.address, timeout)
                    break
            elif [
                p
                for p in service_pids(str(self.run_dir), "explorer" if service == "proxy" else service)
                if p not in old
            ]:
                if service == "buffer":
                    await wait_healthy(cfg.services.buffer.address, timeout)
                    break
                if await _proxy_up(self.url):
                    break
        return time.monotonic() - killed

    def stop(self) -> dict[str, Any]:
        """Stop the trainer, then the run (Ctrl-C); returns the stage's summary.json entry."""
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
        for proc, sig, grace in ((self.trainer, signal.SIGTERM, 60), (self.run, signal.SIGINT, 120)):
            if proc is not None and proc.poll() is None:
                proc.send_signal(sig)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        for service in ("buffer", "synchronizer", "explorer"):  # none may outlive its runner
            for pid in service_pids(str(self.run_dir), service):
                os.kill(pid, signal.SIGKILL)
        summary = self.run_dir / "summary.json"
        return dict(json.loads(summary.read_text())["stages"][0]) if summary.exists() else {}


async def _proxy_up(url: str) -> bool:
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return r.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False
