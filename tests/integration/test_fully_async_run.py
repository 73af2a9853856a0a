"""`trinity run` with synchronizer.sync_style fully_async on the builtin tiny model: the trainer
publishes after every step and trains on; the explorer loads the newest version every 2 steps; with
max_staleness 2 every trained row's version is >= (the step that trained it) - 2, and summary.json's
counters add up (written = trained + buffered + dropped), with two explorers (explorer.replicas)
writing into the one buffer; and the trainer SIGKILLed during such a run loses nothing uncounted. The
sync styles with stand-in processes: tests/integration/test_sync_styles.py."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import yaml

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.integration.drills import events, in_weights, progress, run_with_trainer_killed
from tests.integration.runs import PORTS, stages, trinity_run, write_run_config

pytestmark = pytest.mark.slow
BATCH, REPEAT, STEPS, MAX_STALENESS = 2, 2, 5, 2


def async_config(tmp_path: pathlib.Path, steps: int, tasks: int) -> dict[str, Any]:
    data = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), tasks, seed=3), data)
    return {
        "project": "fa",
        "name": "run",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 8, "max_response_tokens": 4},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": REPEAT, "optimizer": {"lr": 1e-4}},
        "buffer": {
            "batch_size": BATCH,
            "total_steps": steps,
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


@pytest.mark.timeout(600)
def test_fully_async_run_trains_within_the_staleness_bound(tmp_path: pathlib.Path) -> None:
    cfg = async_config(tmp_path, STEPS, 32)
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


@pytest.mark.timeout(600)
def test_a_trainer_killed_in_a_fully_async_run_loses_nothing_uncounted(tmp_path: pathlib.Path) -> None:
    cfg = async_config(tmp_path, 16, 200)
    cfg["trainer"] = {"save_interval": 4}
    config = tmp_path / "async.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    run_dir = tmp_path / "runs" / "fa" / "run"
    # past a checkpoint (save_interval 4), never on one, so its last steps are lost with it
    out = run_with_trainer_killed(config, run_dir, 4, 5, tmp_path / "run.log")
    assert "trainer exited with code -9; restarting it" in out
    rows = progress(run_dir)
    live, lost = in_weights(rows, events(run_dir))
    assert lost, "the trainer was killed a step or two after its checkpoint: steps were lost"
    trained = [rid for row in live for rid in row["rows"]]
    assert len(trained) == len(set(trained)), "a row's update is in the weights twice"
    replayed = {rid for row in rows if row.get("replayed") for rid in row["rows"]}
    assert {rid for row in lost for rid in row["rows"]} <= replayed
    summary = stages(run_dir)[0]
    assert summary["status"] == "complete" and summary["steps"] == 16 and summary["updates_lost"] == 0
    counts = summary["experiences"]
    assert counts["trained"] == len(trained)
    assert counts["written"] == counts["trained"] + counts["buffered"] + sum(counts["dropped"].values())
