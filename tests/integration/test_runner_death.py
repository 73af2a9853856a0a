"""A `trinity run` killed with SIGKILL: its services stop on their own, in the runner's order
(explorer, trainer, synchronizer, buffer last), so the trainer's last acks reach a live buffer."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import sqlite3
import time

import pytest
import yaml

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.integration.test_e2e_run import PORTS, child_pids, kill_all, progress, start_run, wait_for

pytestmark = pytest.mark.slow
SERVICES = ("explorer", "trainer", "synchronizer", "buffer")  # the order they must stop in


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (the runner that would reap it is dead)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def config_of(tmp_path: pathlib.Path) -> pathlib.Path:
    data = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), 1000, seed=5), data)
    cfg = {
        "project": "orphans",
        "name": "run",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 8, "max_response_tokens": 4},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "buffer": {
            "batch_size": 8,
            "total_steps": 200,
            "explorer_input": {
                "taskset": {
                    "name": "tasks",
                    "storage_type": "file",
                    "path": str(data),
                    "format": {"prompt_key": "question", "response_key": "answer"},
                    "rollout_args": {"temperature": 1.0, "max_tokens": 4},
                    "default_workflow_type": "arith_workflow",
                }
            },
            "trainer_input": {"experience_buffer": {"name": "experiences", "storage_type": "queue"}},
        },
        "explorer": {"eval_on_startup": False},
        "synchronizer": {"sync_method": "checkpoint", "sync_interval": 1},
        "trainer": {"save_interval": 5, "micro_batch_size": 32},
        "services": {**PORTS, "shutdown_grace_s": 3},
    }
    config = tmp_path / "orphans.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return config


@pytest.mark.timeout(600)
def test_a_killed_runner_takes_its_services_down_in_order(tmp_path: pathlib.Path) -> None:
    config = config_of(tmp_path)
    run_dir = tmp_path / "runs" / "orphans" / "run"
    marker, log = str(run_dir), tmp_path / "run.log"
    proc = start_run(config, log)
    try:
        wait_for("trainer step 6", lambda: len(progress(run_dir)) >= 6, proc, 240)
        pids = {s: child_pids(marker, s) for s in SERVICES}
        assert all(len(p) == 1 for p in pids.values()), pids
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(10)
        gone: dict[str, float] = {}
        while len(gone) < len(SERVICES) and time.monotonic() - killed < 120:
            for service, [pid] in pids.items():
                if service not in gone and not alive(pid):
                    gone[service] = round(time.monotonic() - killed, 2)
            time.sleep(0.01)
    finally:  # a failed assertion must not leave services running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        kill_all(marker)
    print("seconds from the runner's SIGKILL to each service's exit:", json.dumps(gone))
    assert sorted(gone, key=gone.__getitem__) == list(SERVICES), gone
    logs = {s: (run_dir / "logs" / f"{s}.log").read_text() for s in SERVICES}
    for service, text in logs.items():
        assert '"server_stopped"' in text.rsplit('"parent_gone"', 1)[-1], f"{service} did not stop gracefully"
    after_kill = logs["trainer"].rsplit('"parent_gone"', 1)[-1]
    assert "ack_retry" not in after_kill and "ack_deferred_to_restart" not in after_kill
    assert '"trainer_done"' in after_kill  # its step finished or abandoned, a checkpoint saved
    with sqlite3.connect(run_dir / "buffer" / "experiences.sqlite") as db:  # acked or given back
        assert db.execute("SELECT count(*) FROM items WHERE state = 1").fetchone()[0] == 0
    assert max(gone.values()) < 10, gone  # 0.6 s measured; the bound only catches a hang
