"""`trinity run` with synchronizer.sync_style fully_async on the builtin tiny model: the trainer
publishes after every step and trains on; the explorer loads the newest version every 2 steps; with
max_staleness 2 every trained row's version is >= (the step that trained it) - 2, and summary.json's
counters add up (written = trained + buffered + dropped), with two explorers (explorer.replicas)
writing into the one buffer. The sync styles with stand-in processes: tests/integration/test_sync_styles.py."""

from __future__ import annotations

import json
import pathlib

import pytest

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.integration.runs import PORTS, stages, trinity_run, write_run_config

pytestmark = pytest.mark.slow
BATCH, REPEAT, STEPS, MAX_STALENESS = 2, 2, 5, 2


@pytest.mark.timeout(600)
def test_fully_async_run_trains_within_the_staleness_bound(tmp_path: pathlib.Path) -> None:
    data = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), 32, seed=3), data)
    cfg = {
        "project": "fa",
        "name": "run",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 8, "max_response_tokens": 4},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": REPEAT, "optimizer": {"lr": 1e-4}},
        "buffer": {
            "batch_size": BATCH,
            "total_steps": STEPS,
            "explorer_input": {
                "taskset": {
                    "name": "tasks",
                    "path": str(data),
                    "format": {"prompt_key": "question", "response_key": "answer"},
                    "default_workflow_type": "arith_workflow",
                }
            },
            "trainer_input": {"experience_buffer": {"name": "rollouts", "storage_type": "queue"}},
        },
        "explorer": {"eval_on_startup": False, "replicas": 2},
        "synchronizer": {
            "sync_style": "fully_async",
            "sync_method": "checkpoint",
            "sync_interval": 1,
            "explorer_sync_interval": 2,
            "max_staleness": MAX_STALENESS,
        },
        "monitor": {"monitor_type": "none"},
        "services": {**PORTS, "shutdown_grace_s": 3},
    }
    trinity_run(write_run_config(cfg, tmp_path / "config.yaml"))
    run_dir = tmp_path / "runs" / "fa" / "run"
    summary = stages(run_dir)[0]
    assert summary["status"] == "complete" and summary["steps"] == STEPS
    steps = [json.loads(line) for line in (run_dir / "trainer" / "progress.jsonl").read_text().splitlines()]
    # staleness/max = (weights' version before the step) - oldest row version = step - 1 - oldest
    for record in steps:
        lag = record["metrics"]["staleness/max"] + 1  # training step - oldest version
        assert lag <= MAX_STALENESS, record
    for name in ("explorer", "explorer-2"):  # both explorers ran rollout steps
        progress = run_dir / "explorer" / f"progress-{name}.jsonl"
        records = [json.loads(line) for line in progress.read_text().splitlines()]
        assert [r for r in records if r.get("metrics", {}).get("time/rollout_s", 0) > 0], name
    counts = summary["experiences"]
    assert counts["written"] == counts["trained"] + counts["buffered"] + sum(counts["dropped"].values())
    assert counts["trained"] == STEPS * BATCH * REPEAT
