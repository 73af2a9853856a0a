"""The child processes of a `trinity run` stage: each service a `python -m services.<name>` child.

`start` launches a child (pinned by $TRINITY_PIN_CPUS where that names it), pumps its output into
its log file and the console, and waits until it answers its health check; `stop` ends it
(SIGTERM, then SIGKILL after the grace), `stop_all` in the stop order of parent_watch.py. `watch`
waits for the workers to finish, restarting a child that dies unexpectedly up to `max_restarts`
times (not one that rejected its config, exit code 2). The pids of the live children are kept in
`<run dir>/logs/children.json` for them to stop in order should the runner itself die.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.cli.prepare import (
    LABEL_WIDTH,
    child_endpoint,
    child_env,
    pin_prefix,
    say,
    takes_turns,
)
from services.cli.progress import pump
from services.common.config import TrinityConfig
from services.common.health import wait_healthy
from services.common.logging import LOG_FILE_ENV
from services.common.parent_watch import LABEL_ENV, SIBLINGS_ENV, stop_order, write_siblings
from services.common.procs import listening


@dataclass
class Child:
    name: str
    proc: asyncio.subprocess.Process
    log_file: Any
    address: str = ""
    pump: asyncio.Task[None] | None = None
    tail: list[str] = field(default_factory=list)


class ChildProcesses:
    """The children of one stage: started, watched, restarted and stopped; see the module docstring."""

    def __init__(
        self, cfg: TrinityConfig, config_path: str, *, verbose: bool = False, max_restarts: int = 3
    ) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.verbose = verbose
        self.max_restarts = max_restarts
        self.children: dict[str, Child] = {}
        self.overrides: dict[str, tuple[str, ...]] = {}  # --set items a worker keeps across restarts
        self.log_dir = os.path.join(cfg.run_dir, "logs")
        # {label: pid} of the children, for them to stop in order if this process dies (parent_watch.py)
        self.siblings_file = os.path.join(self.log_dir, "children.json")
        self.service_of: dict[str, str] = {}  # child label -> service module (explorer-2 -> explorer)

    def _record_children(self) -> None:
        write_siblings(self.siblings_file, {label: c.proc.pid for label, c in self.children.items()})

    async def start(self, name: str, *overrides: str, label: str | None = None, alone: bool = False) -> Child:
        """Start `python -m services.<name>` and wait until it is healthy; `alone`: the only
        computing worker of the moment (see child_env). An explorer replica (label `explorer-2`, ...)
        is found at the port its overrides give it (replica_overrides)."""
        label = label or name
        self.service_of[label] = name
        endpoint = child_endpoint(self.cfg, name, overrides)
        if endpoint.port and listening(endpoint.host, endpoint.port):
            # its health check would answer for the other server while this child fails to bind
            raise RuntimeError(
                f"{endpoint.address} already has a server listening (another trinity run, or a service "
                f"left over from one?): stop it, or give this run another services.{name}.port"
            )
        os.makedirs(self.log_dir, exist_ok=True)
        log_path = os.path.join(self.log_dir, f"{label}.log")
        # unbuffered: a line the pump took from the child is on disk even if the runner is killed
        log_file = open(log_path, "ab", buffering=0)  # noqa: ASYNC230, SIM115 - closed in stop_all
        args = [arg for item in overrides for arg in ("--set", item)]
        env = child_env(alone=alone, service=name)
        pin = pin_prefix(label, env)
        proc = await asyncio.create_subprocess_exec(
            *pin,
            sys.executable,
            "-m",
            f"services.{name}",
            "--config",
            self.config_path,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={
                **env,
                LOG_FILE_ENV: log_path,
                SIBLINGS_ENV: self.siblings_file,
                LABEL_ENV: label,
            },
            start_new_session=True,
        )
        child = Child(label, proc, log_file, endpoint.address)
        child.pump = asyncio.create_task(self._pump(child))
        self.children[label] = child
        self._record_children()
        await wait_healthy(
            endpoint.address,
            self.cfg.services.health_wait_s,
            services_cfg=self.cfg.services,
            alive=lambda: proc.returncode is None,
            finished=lambda: proc.returncode == 0,
        )
        return child

    async def _pump(self, child: Child) -> None:
        assert child.proc.stdout is not None
        prefix = f"[{child.name:<{LABEL_WIDTH}}] "
        await pump(child.proc.stdout, child.log_file, prefix, child.tail, verbose=self.verbose)

    async def stop(self, label: str) -> None:
        child = self.children.pop(label, None)
        if child is None:
            return
        self._record_children()
        grace = self.cfg.services.shutdown_grace_s + 5
        if child.proc.returncode is None:
            child.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(child.proc.wait(), grace)
            except asyncio.TimeoutError:
                say(f"{label} did not stop in {grace:.0f}s; killing it", err=True)
                child.proc.kill()
                await child.proc.wait()
        if child.pump is not None:
            await child.pump
        child.log_file.close()

    async def stop_all(self) -> None:
        for label in stop_order(list(self.children)):
            await self.stop(label)

    def _alone(self, workers: Sequence[str]) -> bool:
        """Each worker may use every core: it is the only one, or the workers take turns."""
        return len(workers) == 1 or (len(workers) == 2 and takes_turns(self.cfg))

    async def watch(self, workers: Sequence[str]) -> int:
        """Until every worker of `workers` exits 0 (then 0): a child that exits otherwise is restarted,
        up to max_restarts times each (then 1); one that rejected its config (code 2) is not (1)."""
        restarts: dict[str, int] = {}
        done: set[str] = set()
        while True:
            waits = {asyncio.ensure_future(c.proc.wait()): label for label, c in self.children.items()}
            finished, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for fut in pending:
                fut.cancel()
            for fut in finished:
                label, code = waits[fut], fut.result()
                if label in workers and code == 0:
                    done.add(label)
                    say(f"{label} finished")
                    await self.stop(label)  # it has exited: stop only releases it (pump, log)
                    continue
                if code == 2:  # the service rejected its config: a restart would fail the same way
                    say(f"{label} exited with code 2 (invalid config); not restarting it", err=True)
                    return 1
                restarts[label] = restarts.get(label, 0) + 1
                if restarts[label] > self.max_restarts:
                    say(f"{label} exited with code {code} {restarts[label]} times; giving up", err=True)
                    return 1
                say(
                    f"{label} exited with code {code}; restarting it ({restarts[label]}/{self.max_restarts})",
                    err=True,
                )
                await self.stop(label)
                await self.start(
                    self.service_of.get(label, label),
                    *self.overrides.get(label, ()),
                    label=label,
                    alone=label in workers and self._alone(workers),
                )
            if done == set(workers):
                return 0
