"""Which workflow, reward fn, repeat_times and sampling a task runs with, through a real buffer and
explorer (`trinity run` in explore mode on the builtin tiny model): the settings are decided once
(services/common/config/tasksets.py), carried on the wire by the buffer, and only looked up by the
explorer. One run, one test per precedence rule.

A plugin workflow records which name it was registered under (metric `wf_<tag>`) and the sampling
temperature it was handed; the reward fns are dotted paths to plugin functions with distinct
constant rewards, so each eval taskset's scores say which settings it ran with.
"""

from __future__ import annotations

import json
import pathlib
import textwrap
from typing import Any

import pytest

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.integration.runs import PORTS, stages, trinity_run, write_run_config

pytestmark = pytest.mark.slow
BATCH = 4

PLUGIN = textwrap.dedent("""
    from services.explorer.workflows import WORKFLOWS
    from services.explorer.workflows.math import SimpleWorkflow


    def reward_one(**_):
        return 1.0


    def reward_half(**_):
        return 0.5


    def reward_quarter(**_):
        return 0.25


    def marker(tag):
        class Marker(SimpleWorkflow):
            def run(self):
                exps = super().run()
                for exp in exps:
                    exp.metrics["wf_" + tag] = 1.0
                    exp.metrics["temperature"] = float(self.task.rollout_args.temperature)
                return exps

        Marker.__name__ = "Marker_" + tag
        return Marker


    for _tag in ("train", "eval", "own", "legacy"):
        WORKFLOWS.register_module("marker_" + _tag, marker(_tag))
""")


def _config(tmp_path: pathlib.Path, data: pathlib.Path, plugins: pathlib.Path) -> dict[str, Any]:
    fmt = {"prompt_key": "question", "response_key": "answer"}

    def eval_set(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "path": str(data), "total_steps": 1, "format": fmt, **extra}

    return {
        "project": "resolution",
        "name": "run",
        "mode": "explore",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {
            "model_path": "builtin:tiny-arith",
            "max_prompt_tokens": 8,
            "max_response_tokens": 4,
            "temperature": 0.7,
        },
        # no repeat_times: the grpo preset's 2 applies to every service
        "algorithm": {"algorithm_type": "grpo"},
        "buffer": {
            "batch_size": BATCH,
            "total_steps": 1,
            "explorer_input": {
                "taskset": {"name": "train", "path": str(data), "format": fmt},
                "eval_tasksets": [
                    # names no workflow, reward fn, repeat_times or temperature: every default applies
                    eval_set("defaults"),
                    # names its own of each: they win
                    eval_set(
                        "own",
                        default_workflow_type="marker_own",
                        default_reward_fn_type="trinity_plugin_markers:reward_one",
                        repeat_times=3,
                        rollout_args={"temperature": 0.0},
                    ),
                ],
                "default_workflow_type": "marker_train",
                "default_eval_workflow_type": "marker_eval",
                "default_reward_fn_type": "trinity_plugin_markers:reward_half",
            },
            "default_workflow_type": "marker_legacy",
            "default_reward_fn_type": "trinity_plugin_markers:reward_quarter",
            "trainer_input": {"experience_buffer": {"name": "rollouts", "storage_type": "queue"}},
        },
        "explorer": {"eval_on_startup": True, "eval_interval": 1000, "plugin_dirs": [str(plugins)]},
        "monitor": {"monitor_type": "none"},
        "services": {**PORTS, "shutdown_grace_s": 3},
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp_path = tmp_path_factory.mktemp("resolution")
    data = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), 8, seed=3), data)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "markers.py").write_text(PLUGIN)
    trinity_run(write_run_config(_config(tmp_path, data, plugins), tmp_path / "config.yaml"), timeout=300)
    run_dir = tmp_path / "runs" / "resolution" / "run"
    summary = stages(run_dir)[0]
    evals = [json.loads(line) for line in (run_dir / "eval" / "results.jsonl").read_text().splitlines()]
    scores: dict[str, float] = {}
    for line in evals:
        scores.update(line["scores"])
    return {"summary": summary, "scores": scores}


def test_grpo_without_repeat_times_samples_groups_of_two(run: dict[str, Any]) -> None:
    # one step of BATCH tasks, 2 rollouts each (Trinity's grpo preset), all still in the queue
    assert run["summary"]["experiences"]["written"] == BATCH * 2


def test_eval_taskset_without_workflow_runs_default_eval_workflow_type(run: dict[str, Any]) -> None:
    scores = run["scores"]
    assert scores["eval/defaults/wf_eval/mean@1"] == 1.0
    assert not any(k.startswith(("eval/defaults/wf_train", "eval/defaults/wf_legacy")) for k in scores)


def test_a_tasksets_own_workflow_beats_every_default(run: dict[str, Any]) -> None:
    scores = run["scores"]
    assert scores["eval/own/wf_own/mean@3"] == 1.0
    assert not any(k.startswith(("eval/own/wf_eval", "eval/own/wf_train")) for k in scores)


def test_reward_fn_taskset_then_explorer_input_default(run: dict[str, Any]) -> None:
    scores = run["scores"]
    assert scores["eval/own/reward/mean@3"] == 1.0  # its own reward_one
    assert scores["eval/defaults/reward/mean@1"] == 0.5  # explorer_input's, not buffer's older key


def test_eval_repeat_times_own_value_else_one(run: dict[str, Any]) -> None:
    scores = run["scores"]
    assert "eval/own/reward/best@3" in scores  # 3 samples per task
    assert "eval/defaults/reward/mean@1" in scores  # eval tasksets default to 1, not the preset's 2


def test_rollout_args_taskset_over_model(run: dict[str, Any]) -> None:
    scores = run["scores"]
    assert scores["eval/own/temperature/mean@3"] == 0.0  # the taskset's rollout_args
    assert scores["eval/defaults/temperature/mean@1"] == pytest.approx(0.7)  # model.temperature
