"""`trinity run` of multi_step_grpo (issue 20) and gigpo (issue 33) on a multi-turn chat game.

step_wise_chat_env_workflow plays guess_number over the rollout model's OpenAI endpoint, one call per
turn; the model's history turns each call into one experience stamped with its step. The explorer's
pipeline computes step_wise_grpo's advantages (the preset's advantage fn), the trainer trains on the
rows as they come (gigpo: its operator, over the whole explorer step). Checked: the explorer ran
the operator over 8 runs of several calls each, the trainer trained two steps, and gigpo's operator
found the anchor state the runs share. (The tiny model is untrained, so replies run to the length
limit; the workflow plays them anyway with stop_on_truncation false. The advantage numbers are
checked by hand in tests/unit/explorer/pipeline/test_step_wise.py and test_gigpo.py.)
"""

from __future__ import annotations

import json
import pathlib

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import write_config
from tests.integration.test_e2e_run import PORTS, finish, progress, start_run


@pytest.mark.timeout(600)
@pytest.mark.parametrize("algorithm_type", ["multi_step_grpo", "gigpo"])
def test_multi_step_run_completes(tmp_path: pathlib.Path, algorithm_type: str) -> None:
    tasks = tmp_path / "games.jsonl"
    tasks.write_text("".join(json.dumps({"low": 0, "high": 9, "target": t}) + "\n" for t in (3, 7, 5, 1)))
    config = write_config(
        tmp_path / "config.yaml",
        {
            "project": "ms",
            "name": "multi_step",
            "mode": "both",
            "checkpoint_root_dir": str(tmp_path / "runs"),
            "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 200, "max_response_tokens": 8},
            "algorithm": {"algorithm_type": algorithm_type, "repeat_times": 4},
            "buffer": {
                "batch_size": 2,
                "train_batch_size": 8,
                "total_steps": 2,
                "explorer_input": {
                    "taskset": {
                        "name": "games",
                        "storage_type": "file",
                        "path": str(tasks),
                        "workflow_args": {"max_turns": 3, "stop_on_truncation": False},
                    },
                    "default_workflow_type": "step_wise_chat_env_workflow",
                },
                "trainer_input": {"experience_buffer": {"name": "experiences", "storage_type": "queue"}},
            },
            "explorer": {"rollout_model": {"enable_history": True}},
            "synchronizer": {"sync_method": "checkpoint", "sync_interval": 1},
            "monitor": {"monitor_type": "tensorboard"},
            "services": {**PORTS, "shutdown_grace_s": 3},
        },
    )
    log = tmp_path / "run.log"
    finish(start_run(config, log), log, timeout=450)

    run_dir = tmp_path / "runs" / "ms" / "multi_step"
    (stage,) = json.loads((run_dir / "summary.json").read_text())["stages"]
    assert stage["steps"] == 2 and stage["experiences"]["trained"] == 2 * 8
    assert len(progress(run_dir)) == 2
    scalars = EventAccumulator(str(run_dir / "monitor" / "tensorboard" / "explorer"))
    scalars.Reload()
    tags = scalars.Tags()["scalars"]
    operator = "pipeline/0_" + ("gigpo" if algorithm_type == "gigpo" else "step_wise_grpo")
    runs = [e.value for e in scalars.Scalars(f"{operator}/runs")]
    assert runs and all(r == 2 * 4 for r in runs), tags
    if algorithm_type == "gigpo":
        # every run opens on the same conversation (the games differ only in their hidden target):
        # the first calls share an anchor state
        shared = [e.value for e in scalars.Scalars(f"{operator}/anchor_groups_size_gt1")]
        assert shared and all(s >= 1 for s in shared), shared
        experiences = [e.value for e in scalars.Scalars(f"{operator}/experience_count")]
        assert max(experiences) > 2 * 4  # more calls than runs
    else:
        steps_per_run = [e.value for e in scalars.Scalars(f"{operator}/steps_per_run")]
        # a guess that misses gets an answer and another turn: runs are longer than one call
        assert max(steps_per_run) > 1.0
    turns = [e.value for e in scalars.Scalars("rollout/actual_env_steps/mean")]
    assert all(1.0 <= t <= 3.0 for t in turns)
