"""Partial rollouts in a fully_async `trinity run` on the builtin tiny model: a version the trainer
publishes while an explorer step generates is loaded between two tokens and the in-flight sequences
finish under it (services/explorer/mid_step.py). The run's config is test_fully_async_run.py's with
one explorer that checks for a newer version before every step (explorer_sync_interval 1), responses
of 6 to 8 tokens, and the test hook TRINITY_TEST_HOLD_TOKEN holding the engine before token 3 of the
first step whose check is open until the weights arrive, so the publish lands mid-generation
however fast the engine is."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.integration.runs import stages, trinity_run, write_run_config
from tests.integration.test_fully_async_run import BATCH, REPEAT, async_config

pytestmark = pytest.mark.slow
STEPS, HOLD_AT, MIN_TOKENS, MAX_TOKENS = 4, 3, 6, 8


def lines(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(600)
def test_a_version_published_mid_step_is_loaded_between_two_tokens(tmp_path: pathlib.Path) -> None:
    cfg = async_config(tmp_path, STEPS, 32)
    cfg["model"].update(max_response_tokens=MAX_TOKENS, min_response_tokens=MIN_TOKENS)
    cfg["explorer"].update(replicas=1, env_vars={"TRINITY_TEST_HOLD_TOKEN": str(HOLD_AT)})
    cfg["synchronizer"]["explorer_sync_interval"] = 1
    trinity_run(write_run_config(cfg, tmp_path / "config.yaml"))
    run_dir = tmp_path / "runs" / "fa" / "run"
    summary = stages(run_dir)[0]
    assert summary["status"] == "complete" and summary["steps"] == STEPS
    explored = lines(run_dir / "explorer" / "progress-explorer.jsonl")
    partial = [row for record in explored for row in record.get("partial", [])]
    # the held batch: every row of it went on under the new weights from token HOLD_AT
    assert partial, explored
    for row in partial:
        old, new = row["model_versions"]
        assert old < new and row["model_version"] == old  # the oldest is the row's version
        assert row["version_starts"] == [0, HOLD_AT]  # no token lost or redone at the switch
        assert MIN_TOKENS <= row["response_length"] <= MAX_TOKENS
    # the trainer trained them as rows of their oldest version: its staleness is measured from it
    trained = lines(run_dir / "trainer" / "progress.jsonl")
    by_row = {key: record for record in trained for key in record["rows"]}
    for row in partial:
        record = by_row.get(row["row"])
        if record is not None:  # else still buffered when the run ended
            assert record["metrics"]["staleness/max"] >= record["step"] - 1 - row["model_version"]
    assert any(row["row"] in by_row for row in partial)
    counts = summary["experiences"]
    assert counts["written"] == counts["trained"] + counts["buffered"] + sum(counts["dropped"].values())
    assert counts["trained"] == STEPS * BATCH * REPEAT
