"""`trinity debug` before a model loads: which stage and taskset it runs, and the tasks it builds from
the taskset's file with the settings the buffer would give them. (The command itself, with a real
model and real workflows, is tests/integration/test_debug_cli.py.)"""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from services.cli.debug import build_tasks, pick_taskset
from services.common.config import load_config
from services.common.errors import InvalidArgument
from services.explorer.rewards.exact import arith_reward
from services.explorer.workflows.math import ArithWorkflow, MathWorkflow
from services.explorer.workflows.multi_turn import StepWiseEnvWorkflow


def config(tmp_path: pathlib.Path, rows: list[dict]) -> pathlib.Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    eval_tasks = tmp_path / "eval.jsonl"
    eval_tasks.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n")
    data = {
        "mode": "explore",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "temperature": 0.5},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "buffer": {
            "batch_size": 2,
            "explorer_input": {
                "taskset": {
                    "name": "train",
                    "storage_type": "file",
                    "path": str(tasks),
                    "format": {"prompt_key": "question", "response_key": "answer"},
                    "rollout_args": {"max_tokens": 3},
                    "reward_fn_args": {},
                },
                "eval_tasksets": [
                    {"name": "held_out", "storage_type": "file", "path": str(eval_tasks), "repeat_times": 2}
                ],
                "default_workflow_type": "arith_workflow",
                "default_eval_workflow_type": "math_workflow",
                "default_reward_fn_type": "arith_reward",
            },
            "trainer_input": {"experience_buffer": {"name": "exps", "storage_type": "queue"}},
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_embedded_default_runs_the_first_stage_that_explores():
    cfg = load_config(None)
    _stage_cfg, stage, section, is_eval = pick_taskset(cfg, None, None)
    assert (stage, section.name, is_eval) == ("grpo", "rl_tasks", False)  # not sft, a train stage
    _, stage, section, _ = pick_taskset(cfg, "sft", None)  # named, a train stage is fine
    assert (stage, section.name) == ("sft", "rl_tasks")
    _, stage, eval_section, is_eval = pick_taskset(cfg, None, "eval")
    assert (stage, eval_section.name, is_eval) == ("grpo", "eval", True)


def test_unknown_stage_or_taskset_is_an_error_naming_the_known_ones():
    cfg = load_config(None)
    with pytest.raises(InvalidArgument, match=r"no stage 'rl'; the config's stages: \['sft', 'grpo'\]"):
        pick_taskset(cfg, "rl", None)
    with pytest.raises(
        InvalidArgument,
        match=r"no taskset 'x' in the stages that explore \(mode other than train\); tasksets: \['eval', 'rl_tasks'\]",
    ):
        pick_taskset(cfg, None, "x")


def test_tasks_are_the_first_rows_with_the_tasksets_effective_settings(tmp_path: pathlib.Path):
    rows = [{"question": f"{i}+1=", "answer": str(i + 1), "task_id": f"q{i}"} for i in range(5)]
    cfg, _, section, is_eval = pick_taskset(load_config(config(tmp_path, rows)), None, None)
    tasks, reward_fn = build_tasks(cfg, section, is_eval=is_eval, count=3)
    assert [t.task_id for t in tasks] == ["q0", "q1", "q2"] and [t.index for t in tasks] == [0, 1, 2]
    assert reward_fn == "arith_reward"
    first = tasks[0]
    assert first.workflow is ArithWorkflow and first.workflow_name == "arith_workflow"
    assert first.reward_fn is arith_reward and first.repeat_times == 4  # algorithm.repeat_times
    assert first.rollout_args.temperature == 0.5 and first.rollout_args.max_tokens == 3  # model's, taskset's
    assert first.task_desc == "0+1=" and first.truth == "1" and first.taskset == "train" and not first.is_eval


def test_workflow_and_repeat_times_can_be_overridden(tmp_path: pathlib.Path):
    rows = [{"question": "0+1=", "answer": "1", "low": 0, "high": 9, "target": 3}]
    cfg, _, section, _ = pick_taskset(load_config(config(tmp_path, rows)), None, None)
    [task], _ = build_tasks(
        cfg, section, is_eval=False, count=5, workflow="multi_turn_workflow", repeat_times=2
    )
    assert task.workflow is StepWiseEnvWorkflow and task.workflow_name == "multi_turn_workflow"
    assert task.repeat_times == 2 and task.task_id == "0"  # no id column: the row's index


def test_an_eval_taskset_gets_the_eval_workflow_and_its_own_repeat_times(tmp_path: pathlib.Path):
    cfg, _, section, is_eval = pick_taskset(
        load_config(config(tmp_path, [{"question": "1"}])), None, "held_out"
    )
    [task], _ = build_tasks(cfg, section, is_eval=is_eval, count=2)
    assert is_eval and task.is_eval and task.workflow is MathWorkflow and task.repeat_times == 2


def test_a_taskset_without_a_file_is_refused(tmp_path: pathlib.Path):
    cfg, _, section, _ = pick_taskset(load_config(config(tmp_path, [{"question": "1"}])), None, None)
    with pytest.raises(InvalidArgument, match="has no file to read"):
        build_tasks(cfg, section.model_copy(update={"path": None}), is_eval=False, count=1)
