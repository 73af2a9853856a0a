"""`trinity run` of multi_step_grpo on a multi-turn chat game (issue 20).

step_wise_chat_env_workflow plays guess_number over the rollout model's OpenAI endpoint, one call per
turn; the model's history turns each call into one experience stamped with its step. The explorer's
pipeline computes step_wise_grpo's advantages (the preset's advantage fn), the trainer trains on the
rows as they come. Checked: the explorer ran the operator over 8 runs of several calls each, the
trainer trained two steps. (The tiny model is untrained, so replies run to the length limit; the
workflow plays them anyway with stop_on_truncation false. The advantage numbers are checked by hand
in tests/unit/explorer/pipeline/test_step_wise.py.)
"""

from __future__ import annotations

import json
import pathlib

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import write_config
from tests.integration.test_e2e_run import PORTS, finish, progress, start_run


@pytest.mark.timeout(600)
def test_multi_step_grpo_run_completes(tmp_path: pathlib.Path) -> None:
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
            "algorithm": {"algorithm_type": "multi_step_grpo", "repeat_times": 4},
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
    runs = [e.value for e in scalars.Scalars("pipeline/0_step_wise_grpo/runs")]
    steps_per_run = [e.value for e in scalars.Scalars("pipeline/0_step_wise_grpo/steps_per_run")]
    assert runs and all(r == 2 * 4 for r in runs), tags
    # a guess that misses gets an answer and another turn: runs are longer than one call
    assert max(steps_per_run) > 1.0
    turns = [e.value for e in scalars.Scalars("rollout/actual_env_steps/mean")]
    assert all(1.0 <= t <= 3.0 for t in turns)
