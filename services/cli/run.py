"""`trinity run`: every service of the config's mode as a child process on this machine.

Order: buffer, synchronizer, then trainer and/or explorer, each started once the previous ones
report SERVING. Child output is forwarded with a `[name]` prefix and kept in
<run dir>/logs/<service>.log. The run ends when the workers (trainer, explorer) exit 0; if any
child dies otherwise, or on Ctrl-C, the others get SIGTERM (then SIGKILL after the grace).
Stages run one after another, each with its own resolved config in its run dir.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from services.common.config import TrinityConfig, load_config
from services.common.errors import TrinityError
from services.common.health import wait_healthy
from services.common.procs import free_port

INFRA = ("buffer", "synchronizer")
WORKERS_OF_MODE = {"both": ("trainer", "explorer"), "train": ("trainer",), "explore": ("explorer",), "bench": ("explorer",)}
_WIDTH = 12


@dataclass
class Child:
    name: str
    proc: asyncio.subprocess.Process
    log_file: object
    pump: asyncio.Task[None] | None = None
    expected_exit: bool = False
    lines: list[str] = field(default_factory=list)


def services_for_mode(mode: str) -> tuple[str, ...]:
    return (*INFRA, *WORKERS_OF_MODE[mode])


def resolve_ports(cfg: TrinityConfig) -> TrinityConfig:
    """Give every endpoint with port 0 a free port, so children and clients agree on it."""
    updates = {}
    for name in ("buffer", "synchronizer", "trainer", "explorer"):
        endpoint = cfg.services.endpoint(name)  # type: ignore[arg-type]
        if endpoint.port == 0:
            updates[name] = endpoint.model_copy(update={"port": free_port()})
    if not updates:
        return cfg
    return cfg.model_copy(update={"services": cfg.services.model_copy(update=updates)})


def write_resolved_config(cfg: TrinityConfig, path: str) -> None:
    data = cfg.model_dump(mode="json", exclude={"stages"})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)


class Supervisor:
    """Runs one stage's services; see the module docstring."""

    def __init__(self, cfg: TrinityConfig, config_path: str) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.children: dict[str, Child] = {}
        self.log_dir = os.path.join(cfg.run_dir, "logs")

    async def _start(self, name: str) -> Child:
        os.makedirs(self.log_dir, exist_ok=True)
        log_file = open(os.path.join(self.log_dir, f"{name}.log"), "ab")  # noqa: ASYNC230, SIM115 - closed in stop_all
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", f"services.{name}", "--config", self.config_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
        )
        child = Child(name, proc, log_file)
        child.pump = asyncio.create_task(self._pump(child))
        self.children[name] = child
        return child

    async def _pump(self, child: Child) -> None:
        assert child.proc.stdout is not None
        prefix = f"[{child.name:<{_WIDTH}}] "
        async for raw in child.proc.stdout:
            child.log_file.write(raw)  # type: ignore[attr-defined]
            line = raw.decode(errors="replace").rstrip()
            child.lines = (child.lines + [line])[-20:]
            print(prefix + line, flush=True)

    async def run(self) -> int:
        names = services_for_mode(self.cfg.mode)
        try:
            for name in names:
                child = await self._start(name)
                address = self.cfg.services.endpoint(name).address  # type: ignore[arg-type]
                await wait_healthy(
                    address, self.cfg.services.health_wait_s, services_cfg=self.cfg.services,
                    alive=lambda c=child: c.proc.returncode is None,
                )
                print(f"[{'run':<{_WIDTH}}] {name} is SERVING at {address}", flush=True)
            return await self._watch(WORKERS_OF_MODE[self.cfg.mode])
        except (TimeoutError, RuntimeError) as exc:
            print(f"[{'run':<{_WIDTH}}] start-up failed: {exc}", file=sys.stderr, flush=True)
            return 1
        finally:
            await self.stop_all()

    async def _watch(self, workers: Sequence[str]) -> int:
        pending = {name: asyncio.create_task(c.proc.wait()) for name, c in self.children.items()}
        done_workers: set[str] = set()
        while True:
            finished, _ = await asyncio.wait(pending.values(), return_when=asyncio.FIRST_COMPLETED)
            for name, task in list(pending.items()):
                if task not in finished:
                    continue
                del pending[name]
                code = task.result()
                if name in workers and code == 0:
                    done_workers.add(name)
                    print(f"[{'run':<{_WIDTH}}] {name} finished", flush=True)
                    continue
                print(f"[{'run':<{_WIDTH}}] {name} exited with code {code}; stopping the others", file=sys.stderr, flush=True)
                return 1
            if done_workers == set(workers):
                return 0

    async def stop_all(self) -> None:
        grace = self.cfg.services.shutdown_grace_s + 5
        # Workers first, then the infrastructure they write to.
        order = [n for n in ("explorer", "trainer", "synchronizer", "buffer") if n in self.children]
        for name in order:
            child = self.children[name]
            if child.proc.returncode is None:
                child.proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(child.proc.wait(), grace)
                except asyncio.TimeoutError:
                    print(f"[{'run':<{_WIDTH}}] {name} did not stop in {grace:.0f}s; killing it", file=sys.stderr)
                    child.proc.kill()
                    await child.proc.wait()
            if child.pump is not None:
                await child.pump
            child.log_file.close()  # type: ignore[attr-defined]


async def run_async(config: str | None, overrides: Sequence[str] = ()) -> int:
    cfg = load_config(config, overrides)
    if not cfg.continue_from_checkpoint:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        cfg = load_config(config, [*overrides, f"name={cfg.name}_{stamp}"])
    for index, stage in enumerate(cfg.stage_configs):
        stage = resolve_ports(stage)
        path = os.path.join(stage.run_dir, "config.resolved.yaml")
        write_resolved_config(stage, path)
        label = cfg.stages[index].stage_name if cfg.stages else stage.name
        print(f"[{'run':<{_WIDTH}}] stage {index + 1}/{len(cfg.stage_configs)} {label}: mode {stage.mode}, run dir {stage.run_dir}", flush=True)
        code = await Supervisor(stage, path).run()
        if code != 0:
            return code
    return 0


def run(config: str | None, overrides: Sequence[str] = ()) -> int:
    loop = asyncio.new_event_loop()
    main = loop.create_task(run_async(config, overrides))
    loop.add_signal_handler(signal.SIGINT, main.cancel)
    loop.add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        return loop.run_until_complete(main)
    except asyncio.CancelledError:
        print(f"[{'run':<{_WIDTH}}] interrupted; services stopped", file=sys.stderr)
        return 130
    except TrinityError as exc:
        print(f"trinity run: {exc}", file=sys.stderr)
        return 2
    finally:
        loop.close()
