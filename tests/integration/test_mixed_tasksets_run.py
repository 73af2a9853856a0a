"""`trinity run` (mode both, builtin tiny model) exploring from two training tasksets at once
(buffer.explorer_input.tasksets): set A has 6 arithmetic tasks in `question`/`answer` columns, set B
2 in `prompt`/`solution` columns, so a task only runs when it keeps its own set's format. One epoch
of 8 tasks at batch_size 4 is 2 steps (Trinity's total_epochs * N // B), and an epoch reads every task
of every set once: the trainer must train each of the 8 tasks exactly repeat_times times."""

from __future__ import annotations

import collections
import json
import pathlib

import pytest

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.integration.runs import PORTS, stages, trinity_run, write_run_config

pytestmark = pytest.mark.slow
BATCH, REPEAT = 4, 2


@pytest.mark.timeout(600)
def test_a_run_explores_and_trains_tasks_of_both_tasksets(tmp_path: pathlib.Path) -> None:
    rows = generate(ArithSpec(digits=2), 8, seed=5)
    a = [{"id": f"A{i}", **r} for i, r in enumerate(rows[:6])]
    b = [{"id": f"B{i}", "prompt": r["question"], "solution": r["answer"]} for i, r in enumerate(rows[6:])]
    write_jsonl(a, tmp_path / "a.jsonl")
    write_jsonl(b, tmp_path / "b.jsonl")
    cfg = {
        "project": "mix",
        "name": "run",
        "mode": "both",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 8, "max_response_tokens": 4},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": REPEAT, "optimizer": {"lr": 1e-4}},
        "buffer": {
            "batch_size": BATCH,
            "total_epochs": 1,
            "explorer_input": {
                "default_workflow_type": "arith_workflow",
                "tasksets": [
                    {
                        "name": "sums",
                        "path": str(tmp_path / "a.jsonl"),
                        "format": {"prompt_key": "question", "response_key": "answer"},
                    },
                    {
                        "path": str(tmp_path / "b.jsonl"),  # unnamed: taskset_1
                        "format": {"prompt_key": "prompt", "response_key": "solution"},
                        "task_selector": {"selector_type": "shuffle", "seed": 7},
                    },
                ],
            },
            "trainer_input": {"experience_buffer": {"name": "rollouts", "storage_type": "queue"}},
        },
        "explorer": {"eval_on_startup": False},
        "synchronizer": {"sync_method": "checkpoint", "sync_interval": 1},
        "monitor": {"monitor_type": "none"},
        "services": {**PORTS, "shutdown_grace_s": 3},
    }
    trinity_run(write_run_config(cfg, tmp_path / "config.yaml"))
    run_dir = tmp_path / "runs" / "mix" / "run"
    summary = stages(run_dir)[0]
    assert summary["status"] == "complete" and summary["steps"] == 2, summary
    progress = (run_dir / "trainer" / "progress.jsonl").read_text().splitlines()
    trained = [key for line in progress for key in json.loads(line)["rows"]]
    # keys are [producer:]batch/task/run: count each task's trained rollouts
    per_task = collections.Counter(key.rsplit("/", 2)[-2] for key in trained)
    assert per_task == {f"A{i}": REPEAT for i in range(6)} | {f"B{i}": REPEAT for i in range(2)}
    # the buffer kept the mix's cursors in a file of its own
    assert (run_dir / "buffer" / "tasksets.sqlite").exists()
