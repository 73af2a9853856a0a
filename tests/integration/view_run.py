"""A run directory for `trinity view` tests, written as a run writes it: experiences through the
real buffer server (its SQLite files), the trainer's progress.jsonl keys made by the trainer's own
`experience_key`, the stage's config.resolved.yaml. The buffer keeps serving until `stop()`, so
the run is live while a test writes more steps.

Rewards are chosen so every filter has something to find (explorer step s, task t, run r of 4):
task 0 is a flat group (all 1.0 on even steps, all 0.0 on odd ones), task 1 has rewards
0, 1/3, 2/3, 1, task 2 alternates 0 / 1 with s + r. Run 3's last response token has action mask 0.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import pathlib
import sqlite3
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import yaml

from services.buffer.client import BufferClient
from services.common.experience import Experience
from services.common.procs import free_port, start_service, stop_process, wait_healthy
from services.models.loading import builtin_tokenizer
from services.trainer.ports import experience_key
from trinity_grpc.common.v1 import common_pb2 as pb

TASKS, RUNS = 3, 4
STAGE = "demo"


def reward_of(step: int, task: int, run: int) -> float:
    if task == 0:
        return 1.0 if step % 2 == 0 else 0.0
    if task == 1:
        return run / 3
    return float((step + run) % 2)


def run_async(coro_fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """asyncio.run(coro_fn(*args)) on a thread of its own: Playwright's sync API keeps an event
    loop running on the test's thread, where asyncio.run refuses to start another."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(coro_fn(*args))).result()


@functools.cache
def _tokenizer() -> Any:
    return builtin_tokenizer()


def experience(step: int, task: int, run: int) -> Experience:
    tok = _tokenizer()
    prompt = tok.encode(f"{step}+{task}=")
    response = tok.encode(f"{step + task + run}") + [tok.eos_token_id]
    mask = np.ones(len(response), dtype=bool)
    if run == RUNS - 1:
        mask[-1] = False
    reward = reward_of(step, task, run)
    return Experience(
        tokens=np.array(prompt + response, dtype=np.int32),
        prompt_length=len(prompt),
        model_version=max(step - 1, 0),
        reward=reward,
        logprobs=np.array([-0.25 * (k + 1) for k in range(len(response))], dtype=np.float32),
        action_mask=mask,
        task_id=str(task),
        run_id=run,
        group_id=f"explorer/{step}/tasks/{task}",
        batch_id=step,
        producer="explorer",
        metrics={"accuracy": float(reward >= 0.5), "format": 1.0},
        info={"truth": str(step + task)},
        prompt_text=f"{step}+{task}=",
        response_text=str(step + task + run),
    )


class ViewRun:
    """`<tmp>/runs/view/demo`, its buffer served on a free port (`kind`: sql -> table, queue -> fifo)."""

    def __init__(self, tmp: pathlib.Path, *, kind: str = "sql") -> None:
        self.tmp = tmp
        self.port = free_port()
        self.root = tmp / "runs" / "view" / STAGE
        self.config = tmp / "view-run.yaml"
        data: dict[str, Any] = {
            "project": "view",
            "name": STAGE,
            "checkpoint_root_dir": str(tmp / "runs"),
            "model": {"model_path": "builtin:tiny-arith"},
            # as the demo: groups whose rewards all agree carry no signal and are dropped
            "algorithm": {
                "algorithm_type": "grpo",
                "repeat_times": RUNS,
                "advantage_fn_args": {"std_threshold": 0.0},
            },
            "buffer": {
                "batch_size": TASKS,
                "total_steps": 10,
                "trainer_input": {"experience_buffer": {"name": "experiences", "storage_type": kind}},
            },
            # every service on a port of its own: the overview probes them while the run is live
            "services": {
                **{svc: {"port": free_port()} for svc in ("synchronizer", "trainer", "explorer")},
                "buffer": {"port": self.port},
                "shutdown_grace_s": 3,
            },
        }
        self.config.write_text(yaml.safe_dump(data, sort_keys=False))
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.resolved.yaml").write_text(self.config.read_text())
        self.proc: subprocess.Popen[bytes] | None = None
        self.written: list[Experience] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ViewRun:
        self.proc = start_service("buffer", str(self.config), log_path=str(self.tmp / "buffer.log"))
        proc = self.proc
        run_async(lambda: wait_healthy(self.address, timeout=60, alive=lambda: proc.poll() is None))
        return self

    def record_children(self) -> None:
        """logs/children.json as `trinity run` writes it: the stage's services are live."""
        assert self.proc is not None
        (self.root / "logs").mkdir(exist_ok=True)
        (self.root / "logs" / "children.json").write_text(json.dumps({"buffer": self.proc.pid}))

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=10)
            self.proc = None

    async def _write(self, exps: list[Experience]) -> None:
        client = await BufferClient.connect(self.address, timeout=30)
        try:
            await client.write("experiences", exps)
        finally:
            await client.close()

    def write_step(self, step: int) -> list[Experience]:
        """One explorer step: every task's group of RUNS rollouts, in one write."""
        exps = [experience(step, t, r) for t in range(TASKS) for r in range(RUNS)]
        run_async(self._write, exps)
        self.written.extend(exps)
        return exps

    def train_step(self, step: int) -> None:
        """The trainer's progress record of training explorer step `step`'s rows at trainer step `step`."""
        rows = [experience_key(e) for e in self.written if e.batch_id == step]
        rewards = [float(e.reward or 0.0) for e in self.written if e.batch_id == step]
        record = {
            "step": step,
            "time": time.time(),
            "metrics": {
                "critic/rewards/mean": sum(rewards) / len(rewards),
                "perf/tokens_per_s": 100.0 * step,
            },
            "rows": rows,
        }
        path = self.root / "trainer" / "progress.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def buffer_file(self) -> pathlib.Path:
        return self.root / "buffer" / "experiences.sqlite"


def buffer_rows(path: pathlib.Path) -> list[pb.Experience]:
    """Every experience in a buffer file, decoded straight from its SQLite tables (the expectation
    the viewer's filters are checked against)."""
    conn = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True)
    try:
        blobs = conn.execute(
            "SELECT p.payload FROM items AS i JOIN payloads AS p ON p.id = i.id ORDER BY i.id"
        ).fetchall()
    finally:
        conn.close()
    return [pb.Experience.FromString(b) for (b,) in blobs]


def expected_keys(
    path: pathlib.Path, *, step=None, reward_min=None, reward_max=None, flat=None, task=None
) -> set:
    """(step, task_id, run_id) of the buffer's rows that pass the filters, computed from the buffer."""
    rows = buffer_rows(path)
    groups: dict[str, list[float]] = {}
    for e in rows:
        groups.setdefault(e.ids.group_id, []).append(e.reward)
    out = set()
    for e in rows:
        g = groups[e.ids.group_id]
        is_flat = len(g) > 1 and min(g) == max(g)
        if step is not None and e.ids.batch_id != step:
            continue
        if reward_min is not None and e.reward < reward_min:
            continue
        if reward_max is not None and e.reward > reward_max:
            continue
        if flat is not None and is_flat != flat:
            continue
        if task is not None and e.ids.task_id != task:
            continue
        out.add((e.ids.batch_id, e.ids.task_id, e.ids.run_id))
    return out
