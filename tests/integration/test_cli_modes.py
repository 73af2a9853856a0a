"""`trinity run` in the modes other than `both`, through the real CLI on one run dir, as a Trinity
user runs them: `train` (SFT on a file dataset, checkpoints at steps 2 and 4), then `bench` on the
same run (every checkpoint scored in order, then only the latest), then `explore` (rollouts into
the queue, nobody trains them), then `train` again: skipped, then continued to a raised total_steps."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.integration.runs import PORTS, stages, trinity_run, write_run_config

pytestmark = pytest.mark.slow


def job(tmp_path: pathlib.Path) -> dict[str, Any]:
    """SFT of the tiny model on a file dataset, 4 steps, checkpoints at 2 and 4, an eval taskset."""
    data = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), 64, seed=3), data)
    fmt = {"prompt_key": "question", "response_key": "answer"}
    cfg = {
        "project": "modes",
        "name": "run",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 8, "max_response_tokens": 4},
        "algorithm": {"algorithm_type": "sft", "repeat_times": 2},
        "buffer": {
            "batch_size": 4,
            "train_batch_size": 8,
            "total_steps": 4,
            "explorer_input": {
                "taskset": {
                    "name": "tasks",
                    "path": str(data),
                    "format": fmt,
                    "default_workflow_type": "arith_workflow",
                    "rollout_args": {"temperature": 1.0, "max_tokens": 4},
                },
                "eval_tasksets": [
                    {
                        "name": "eval",
                        "path": str(data),
                        "format": fmt,
                        "default_workflow_type": "arith_workflow",
                        "rollout_args": {"temperature": 0.0, "max_tokens": 4},
                    }
                ],
            },
            "trainer_input": {
                "experience_buffer": {"name": "sft", "storage_type": "file", "path": str(data), "format": fmt}
            },
        },
        "explorer": {"eval_on_startup": False},
        "trainer": {"save_interval": 2},
        "monitor": {"monitor_type": "none"},
        "services": {**PORTS, "shutdown_grace_s": 3},
    }
    return cfg


@pytest.mark.timeout(600)
def test_train_then_bench_then_explore_on_one_run(tmp_path: pathlib.Path) -> None:
    config = write_run_config(job(tmp_path), tmp_path / "config.yaml")
    run_dir = tmp_path / "runs" / "modes" / "run"
    summary = lambda: {s["name"]: s for s in stages(run_dir)}  # noqa: E731

    trinity_run(config, "mode=train")
    train = summary()["run:train"]
    assert train["status"] == "complete" and train["steps"] == 4 and train["experiences"]["trained"] == 32
    key = "eval/eval/accuracy/mean@1"

    out = trinity_run(config, "mode=bench")
    bench = summary()["run:bench"]
    assert list(bench["eval"]["by_version"]) == ["2", "4"]  # every full checkpoint, in order
    assert bench["eval"]["start"] == bench["eval"]["by_version"]["2"]
    assert bench["eval"]["end"] == bench["eval"]["by_version"]["4"]
    assert bench["eval"]["end"][key] == train["eval"]["end"][key]  # the same weights score the same (greedy)
    assert "eval of model version 2: " in out and "eval of model version 4: " in out
    versions = [
        r["model_version"]
        for r in map(json.loads, (run_dir / "eval" / "results.jsonl").read_text().splitlines())
    ]
    assert versions[-2:] == [2, 4]

    trinity_run(config, "mode=bench", "explorer.bench_on_latest_checkpoint=true")  # re-scored, not skipped
    assert list(summary()["run:bench"]["eval"]["by_version"]) == ["4"]

    trinity_run(
        config,
        "mode=explore",
        "buffer.trainer_input.experience_buffer.storage_type=queue",
        "buffer.trainer_input.experience_buffer.name=rollouts",
        "buffer.trainer_input.experience_buffer.path=null",
        "buffer.total_steps=2",
    )
    explore = summary()["run:explore"]
    # 2 steps x 4 tasks x 2 rollouts written; nobody trains in explore mode, so all are still buffered
    assert explore["experiences"] == {"written": 16, "trained": 0, "buffered": 16, "dropped": {}}
    assert list(explore["phases"]) == ["explorer:explorer"]  # no trainer in explore mode
    assert set(summary()) == {"run:train", "run:bench", "run:explore"}

    # the finished train stage: the same total_steps skips it; a larger one continues it from its last
    # checkpoint (step 4) to the new total, as Trinity's continue_from_checkpoint does
    assert "run:train already complete; skipping" in trinity_run(config, "mode=train")
    out = trinity_run(config, "mode=train", "buffer.total_steps=6")
    train = summary()["run:train"]
    assert train["status"] == "complete" and train["steps"] == 6 and train["experiences"]["trained"] == 48, (
        out
    )


@pytest.mark.timeout(600)
def test_a_finished_run_trains_on_when_total_steps_is_raised(tmp_path: pathlib.Path) -> None:
    """Mode both: the explorer closed its writer when the first run ended; the continued run's trainer
    must not take that for the end of the data (it starts before the explorer)."""
    cfg = job(tmp_path)
    cfg["algorithm"] = {"algorithm_type": "grpo", "repeat_times": 2, "kl_loss_fn": "none"}
    cfg["buffer"]["total_steps"] = 2
    cfg["buffer"]["trainer_input"] = {"experience_buffer": {"name": "exps", "storage_type": "queue"}}
    cfg["buffer"].pop("train_batch_size")
    config = write_run_config(cfg, tmp_path / "config.yaml")
    run_dir = tmp_path / "runs" / "modes" / "run"

    trinity_run(config)
    assert stages(run_dir)[0]["steps"] == 2
    out = trinity_run(config, "buffer.total_steps=4")
    [stage] = stages(run_dir)
    assert stage["status"] == "complete" and stage["steps"] == 4, out[-3000:]
    assert stage["experiences"]["trained"] == 4 * 4 * 2  # 4 steps of 4 tasks x 2 rollouts
