"""Partial rollouts in a fully_async `trinity run` on vLLM (tiny Llama, CPU): a version the trainer
publishes while an explorer step generates is loaded between two engine steps and the in-flight
sequences finish under it, prefilled again from their tokens so far (vllm_stream.py). The transformers
engine's run (tests/integration/test_partial_rollouts_run.py) with engine_type vllm: one explorer that
checks for a newer version before every step, responses of 6 to 8 tokens, and the test hook
TRINITY_TEST_HOLD_TOKEN holding the engine before token 3 of the first step whose check is open until
the weights arrive, so the publish lands mid-generation however fast the engine is."""

from __future__ import annotations

import json
import pathlib

import pytest

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.integration.runs import PORTS, stages, trinity_run, write_run_config
from tests.vllm.conftest import build_tiny_llama

STEPS, BATCH, REPEAT, HOLD_AT, MIN_TOKENS, MAX_TOKENS = 3, 2, 2, 3, 6, 8


def lines(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(600)
def test_a_version_published_mid_step_is_loaded_between_two_vllm_steps(tmp_path: pathlib.Path) -> None:
    build_tiny_llama(tmp_path / "model")
    data = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), 16, seed=3), data)
    cfg = {
        "project": "fa",
        "name": "vllm",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {
            "model_path": str(tmp_path / "model"),
            "max_prompt_tokens": 8,
            "max_response_tokens": MAX_TOKENS,
            "min_response_tokens": MIN_TOKENS,
            "dtype": "float32",
        },
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
        "explorer": {
            "eval_on_startup": False,
            "env_vars": {"TRINITY_TEST_HOLD_TOKEN": str(HOLD_AT)},
            "rollout_model": {"engine_type": "vllm", "dtype": "float32"},
        },
        "synchronizer": {
            "sync_style": "fully_async",
            "sync_method": "checkpoint",
            "sync_interval": 1,
            "explorer_sync_interval": 1,
        },
        "trainer": {"save_interval": 100},
        "monitor": {"monitor_type": "none"},
        "services": {**PORTS, "shutdown_grace_s": 5, "health_wait_s": 180},
    }
    trinity_run(write_run_config(cfg, tmp_path / "config.yaml"), timeout=540)
    run_dir = tmp_path / "runs" / "fa" / "vllm"
    summary = stages(run_dir)[0]
    assert summary["status"] == "complete" and summary["steps"] == STEPS
    explored = lines(run_dir / "explorer" / "progress-explorer.jsonl")
    loads = [
        json.loads(x) for x in (run_dir / "logs" / "explorer.log").read_text().splitlines() if "mid_step" in x
    ]
    assert [e for e in loads if e.get("event") == "weights_loaded_mid_step"], loads
    partial = [row for record in explored for row in record.get("partial", [])]
    # the held batch: every row of it went on under the new weights from token HOLD_AT
    assert partial, explored
    for row in partial:
        old, new = row["model_versions"]
        assert old < new and row["model_version"] == old  # the oldest is the row's version
        assert row["version_starts"] == [0, HOLD_AT]  # no token lost or redone at the switch
        assert MIN_TOKENS <= row["response_length"] <= MAX_TOKENS
    trained = lines(run_dir / "trainer" / "progress.jsonl")
    by_row = {key: record for record in trained for key in record["rows"]}
    for row in partial:
        record = by_row.get(row["row"])
        if record is not None:  # else still buffered when the run ended
            assert record["metrics"]["staleness/max"] >= record["step"] - 1 - row["model_version"]
    counts = summary["experiences"]
    assert counts["written"] == counts["trained"] + counts["buffered"] + sum(counts["dropped"].values())
    assert counts["trained"] == STEPS * BATCH * REPEAT
