"""Reading a run directory: stages in summary order, the tail of a growing JSON-lines file."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidArgument, NotFound
from services.view.run_dir import open_run, tail_records


def test_tail_records_reads_the_last_records_only(tmp_path) -> None:
    path = tmp_path / "progress.jsonl"
    lines = [json.dumps({"step": i, "pad": "x" * 50}) for i in range(1, 101)]
    path.write_text("\n".join(lines) + '\n{"step": 101, "half')  # a line still being written
    assert [r["step"] for r in tail_records(path, 3)] == [98, 99, 100]
    # a window shorter than the file cuts its first line, which is dropped, not misread
    assert [r["step"] for r in tail_records(path, 500, window=200)] == [99, 100]
    assert tail_records(tmp_path / "missing.jsonl", 3) == []


def test_stages_follow_summary_order_then_names(tmp_path) -> None:
    for name in ("zeta", "grpo", "sft"):
        (tmp_path / name / "trainer").mkdir(parents=True)
    (tmp_path / "notes").mkdir()
    (tmp_path / "summary.json").write_text(json.dumps({"stages": [{"name": "sft"}, {"name": "grpo"}]}))
    run = open_run(str(tmp_path))
    assert [s.name for s in run.stages] == ["sft", "grpo", "zeta"]
    assert run.stages[0].cfg is None and "no config.resolved.yaml" in run.stages[0].cfg_error
    with pytest.raises(NotFound, match="no stage 'rl' in this run; stages: sft, grpo, zeta"):
        run.stage("rl")


def test_a_stage_directory_is_its_own_run(tmp_path) -> None:
    (tmp_path / "buffer").mkdir()
    run = open_run(str(tmp_path))
    assert [s.path for s in run.stages] == [tmp_path]


def test_run_dir_and_config_are_one_or_the_other(tmp_path) -> None:
    with pytest.raises(InvalidArgument, match="one of them"):
        open_run(str(tmp_path), str(tmp_path / "c.yaml"))
    with pytest.raises(InvalidArgument, match="one of them"):
        open_run()
