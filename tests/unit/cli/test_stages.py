"""Stage bookkeeping of `trinity run`: summary.json, chaining weights between stages, eval records,
the trainer's progress.jsonl, and the final table."""

from __future__ import annotations

import json
import math
import pathlib

import pytest

from services.cli import stages as st
from services.common.config import TrinityConfig, load_config

TWO_STAGES = """\
checkpoint_root_dir: {root}
project: proj
name: exp
model:
  model_path: builtin:tiny-arith
  tokenizer_path: /somewhere/tokenizer
  max_response_tokens: 7
stages:
  - stage_name: sft
    mode: train
    algorithm: {{algorithm_type: sft}}
  - stage_name: grpo
"""


@pytest.fixture
def two_stages(tmp_path: pathlib.Path) -> TrinityConfig:
    path = tmp_path / "c.yaml"
    path.write_text(TWO_STAGES.format(root=tmp_path / "runs"))
    return load_config(path)


def write_checkpoint(run_dir: str, step: int, *, complete: bool = True) -> pathlib.Path:
    """A full checkpoint directory as services/trainer/checkpoint.py lays it out."""
    path = pathlib.Path(run_dir) / "checkpoints" / "full" / f"global_step_{step}"
    (path / "model").mkdir(parents=True)
    if complete:
        (path / "trainer_state.json").write_text("{}")
    return path


def write_jsonl(path: pathlib.Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


# ---- summary.json --------------------------------------------------------------------------------


def test_summary_round_trip(tmp_path: pathlib.Path) -> None:
    root = str(tmp_path / "run")  # does not exist yet: save creates it
    summary = {"stages": [{"name": "sft", "status": "complete", "eval": {"end": {"acc": 0.5}}}]}
    st.save_summary(root, summary)
    assert st.load_summary(root) == summary
    assert st.summary_path(root) == str(tmp_path / "run" / "summary.json")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["summary.json"]  # no .tmp left


def test_save_replaces_the_previous_summary(tmp_path: pathlib.Path) -> None:
    st.save_summary(str(tmp_path), {"stages": [{"name": "a"}, {"name": "b"}]})
    st.save_summary(str(tmp_path), {"stages": [{"name": "c"}]})
    assert st.load_summary(str(tmp_path)) == {"stages": [{"name": "c"}]}


def test_missing_or_corrupt_summary_loads_as_empty(tmp_path: pathlib.Path) -> None:
    assert st.load_summary(str(tmp_path / "nowhere")) == {"stages": []}
    (tmp_path / "summary.json").write_text('{"stages": [')  # a half-written file
    assert st.load_summary(str(tmp_path)) == {"stages": []}


# ---- stage_entry ---------------------------------------------------------------------------------


def test_stage_entry_adds_a_pending_entry_once() -> None:
    summary: dict = {"stages": []}
    entry = st.stage_entry(summary, "sft")
    assert entry == {
        "name": "sft",
        "status": "pending",
        "eval": {},
        "steps": 0,
        "experiences": {"written": 0, "trained": 0, "buffered": 0},
        "wall_s": 0.0,
    }
    entry["status"] = "complete"
    assert st.stage_entry(summary, "sft") is entry
    st.stage_entry(summary, "grpo")
    assert [e["name"] for e in summary["stages"]] == ["sft", "grpo"]


def test_stage_entry_finds_an_entry_loaded_from_disk(tmp_path: pathlib.Path) -> None:
    st.save_summary(str(tmp_path), {"stages": [{"name": "sft", "status": "complete"}]})
    summary = st.load_summary(str(tmp_path))
    assert st.stage_entry(summary, "sft") == {"name": "sft", "status": "complete"}
    assert len(summary["stages"]) == 1


# ---- chain_model ---------------------------------------------------------------------------------


def test_first_stage_keeps_its_model(two_stages: TrinityConfig) -> None:
    first = two_stages.stage_configs[0]
    assert st.chain_model(first, None, user_set_model=False) is first


def test_next_stage_starts_from_the_previous_stages_latest_complete_checkpoint(
    two_stages: TrinityConfig,
) -> None:
    previous, stage = two_stages.stage_configs
    write_checkpoint(previous.run_dir, 3)
    latest = write_checkpoint(previous.run_dir, 10)
    write_checkpoint(previous.run_dir, 20, complete=False)  # being written when the stage ended: ignored

    chained = st.chain_model(stage, previous, user_set_model=False)

    assert chained.model.model_path == str(latest / "model")
    assert chained.model.tokenizer_path is None  # the checkpoint carries its tokenizer
    assert chained.model.max_response_tokens == 7  # the rest of model: is kept
    assert chained.run_dir == stage.run_dir and chained.algorithm == stage.algorithm
    assert stage.model.model_path == "builtin:tiny-arith"  # the input is not modified
    assert stage.model.tokenizer_path == "/somewhere/tokenizer"


def test_a_stage_that_sets_its_model_is_not_chained(two_stages: TrinityConfig) -> None:
    previous, stage = two_stages.stage_configs
    write_checkpoint(previous.run_dir, 10)
    assert st.chain_model(stage, previous, user_set_model=True) is stage


def test_without_a_previous_checkpoint_the_stage_keeps_its_model(two_stages: TrinityConfig) -> None:
    previous, stage = two_stages.stage_configs
    write_checkpoint(previous.run_dir, 5, complete=False)
    assert st.chain_model(stage, previous, user_set_model=False) is stage
    assert st.final_model_dir(previous) is None


def test_a_stage_after_one_that_trained_nothing_starts_from_what_that_one_started_from(
    two_stages: TrinityConfig,
) -> None:
    """sft -> bench -> grpo: the bench stage has no checkpoint; grpo still gets sft's weights."""
    sft, later = two_stages.stage_configs
    bench = st.chain_model(later, sft, user_set_model=False)  # sft has no checkpoint yet: unchanged
    assert bench is later
    write_checkpoint(sft.run_dir, 8)
    bench = st.chain_model(later, sft, user_set_model=False)
    grpo = st.chain_model(later, bench, user_set_model=False)  # bench wrote no checkpoint
    assert grpo.model.model_path == bench.model.model_path == st.final_model_dir(sft)


def test_the_previous_stages_end_score_is_the_chained_stages_start_score(tmp_path: pathlib.Path) -> None:
    """Same weights (chained to the final checkpoint) and same eval settings: scoring them again would
    only cost a bench explorer. Anything that changes what or how it scores means a new eval."""
    path = tmp_path / "c.yaml"
    path.write_text(
        TWO_STAGES.format(root=tmp_path / "runs")
        + "buffer:\n  explorer_input:\n    eval_tasksets: [{name: eval, path: /data/eval.jsonl}]\n"
    )
    previous, stage = load_config(path).stage_configs
    assert not st.scores_carry_over(stage, previous)  # no checkpoint: the stage is not chained
    write_checkpoint(previous.run_dir, 10)
    chained = st.chain_model(stage, previous, user_set_model=False)
    assert st.scores_carry_over(chained, previous)
    assert not st.scores_carry_over(stage, previous)  # a stage that sets its own model
    assert not st.scores_carry_over(chained, None)
    other_evals = chained.buffer.explorer_input.model_copy(update={"eval_tasksets": []})
    assert not st.scores_carry_over(
        chained.model_copy(
            update={"buffer": chained.buffer.model_copy(update={"explorer_input": other_evals})}
        ),
        previous,
    )
    longer = chained.model.model_copy(update={"max_response_tokens": 9})
    assert not st.scores_carry_over(chained.model_copy(update={"model": longer}), previous)


def test_half_written_last_lines_are_skipped(two_stages: TrinityConfig) -> None:
    stage = two_stages.stage_configs[1]
    progress = pathlib.Path(stage.run_dir) / "trainer" / "progress.jsonl"
    write_jsonl(progress, [{"step": 1, "metrics": {}, "rows": ["a", "b"]}])
    with open(progress, "a") as fh:
        fh.write('{"step": 2, "metr')  # the trainer was killed mid-write
    assert st.trained_rows(stage)[:2] == (1, 2)
    results = pathlib.Path(stage.run_dir) / "eval" / "results.jsonl"
    write_jsonl(results, [{"step": 0, "scores": {"a": 1.0}}])
    with open(results, "a") as fh:
        fh.write('{"step": 5, "sc')
    assert st.eval_records(stage) == [{"step": 0, "scores": {"a": 1.0}}]


def test_explorer_drops_add_up_per_reason_counting_each_step_once(two_stages: TrinityConfig) -> None:
    stage = two_stages.stage_configs[0]
    assert st.explorer_drops(stage) == {}  # no explorer ran
    explorer = pathlib.Path(stage.run_dir) / "explorer"
    dapo = {"dapo_dynamic_sampling/all_wrong": 8, "refill_surplus": 4}
    write_jsonl(
        explorer / "progress-explorer.jsonl",
        [
            {"step": 1, "metrics": {}, "dropped": dapo},
            {"step": 2, "metrics": {}, "dropped": {"dapo_dynamic_sampling/all_correct": 4}},
            # a restarted explorer redid step 2: its writes were refused, its drops do not count
            {"step": 2, "metrics": {}, "dropped": {"dapo_dynamic_sampling/all_correct": 12}},
            {"step": 3, "metrics": {}},  # written before drops were recorded
        ],
    )
    write_jsonl(explorer / "progress-explorer-2.jsonl", [{"step": 1, "metrics": {}, "dropped": dapo}])
    with open(explorer / "progress-explorer-2.jsonl", "a") as fh:
        fh.write('{"step": 2, "dro')  # killed mid-write
    assert st.explorer_drops(stage) == {
        "dapo_dynamic_sampling/all_wrong": 16,
        "refill_surplus": 8,
        "dapo_dynamic_sampling/all_correct": 4,
    }


# ---- eval records --------------------------------------------------------------------------------


def test_eval_records_reads_every_line_in_order(two_stages: TrinityConfig) -> None:
    stage = two_stages.stage_configs[0]
    assert st.eval_records(stage) == []  # no eval yet
    records = [{"step": 0, "scores": {"a": 0.1}}, {"step": 5, "scores": {"a": 0.4}}]
    write_jsonl(pathlib.Path(stage.run_dir) / "eval" / "results.jsonl", records)
    with open(pathlib.Path(stage.run_dir) / "eval" / "results.jsonl", "a") as fh:
        fh.write("\n")  # blank lines are skipped
    assert st.eval_records(stage) == records


def test_main_first_puts_the_accuracy_mean_first_and_keeps_the_rest_in_order() -> None:
    scores = {
        "eval/eval/tasks": 1000.0,
        "eval/eval/accuracy/best@4": 0.9,
        "eval/eval/accuracy/mean@4": 0.6,
        "eval/eval/format/mean@4": 0.99,
    }
    assert list(st.main_first(scores)) == [
        "eval/eval/accuracy/mean@4",
        "eval/eval/tasks",
        "eval/eval/accuracy/best@4",
        "eval/eval/format/mean@4",
    ]
    assert st.main_first(scores) == scores  # same values


def test_main_first_takes_the_first_tasksets_accuracy_and_falls_back_to_the_first_key() -> None:
    two = {"eval/a/tasks": 5.0, "eval/a/accuracy/mean@1": 0.2, "eval/b/accuracy/mean@1": 0.7}
    assert next(iter(st.main_first(two))) == "eval/a/accuracy/mean@1"
    boxed = {"eval/h/boxed/mean@1": 0.9, "eval/h/lenient/mean@1": 0.8, "eval/h/strict/mean@1": 0.7}
    assert next(iter(st.main_first(boxed))) == "eval/h/strict/mean@1"  # boxed-answer tasksets: strict
    none = {"eval/a/reward/mean@1": 0.2, "eval/a/tasks": 5.0}
    assert list(st.main_first(none)) == ["eval/a/reward/mean@1", "eval/a/tasks"]


# ---- trained_rows --------------------------------------------------------------------------------


def test_trained_rows_from_progress_jsonl(two_stages: TrinityConfig) -> None:
    stage = two_stages.stage_configs[1]
    write_jsonl(
        pathlib.Path(stage.run_dir) / "trainer" / "progress.jsonl",
        [
            {"step": 1, "time": 0.0, "metrics": {"critic/rewards/mean": 0.25}, "rows": ["0/t1/0", "0/t1/1"]},
            {
                "step": 2,
                "time": 1.0,
                "metrics": {"critic/rewards/mean": 0.5},
                "rows": ["1/t2/0", "1/t2/1", "1/t3/0"],
            },
            {"step": 3, "time": 2.0, "metrics": {"actor/loss": 0.1}, "rows": ["2/t4/0"]},  # SFT: no reward
        ],
    )
    steps, rows, rewards = st.trained_rows(stage)
    assert (steps, rows) == (3, 6)
    assert rewards[:2] == [0.25, 0.5]
    assert len(rewards) == 3 and math.isnan(rewards[2])


def test_steps_is_the_highest_step_recorded(two_stages: TrinityConfig) -> None:
    # A trainer restarted from its step-2 checkpoint records step 3 again.
    stage = two_stages.stage_configs[1]
    write_jsonl(
        pathlib.Path(stage.run_dir) / "trainer" / "progress.jsonl",
        [{"step": step, "metrics": {}, "rows": ["r"]} for step in (1, 2, 3, 3, 4)],
    )
    assert st.trained_rows(stage)[0] == 4


def test_trained_rows_without_a_trainer_is_zero(two_stages: TrinityConfig) -> None:
    assert st.trained_rows(two_stages.stage_configs[0]) == (0, 0, [])


# ---- format_table --------------------------------------------------------------------------------


def test_format_table() -> None:
    summary: dict = {"stages": []}
    sft = st.stage_entry(summary, "sft")
    sft.update(steps=500, wall_s=61.4, experiences={"written": 0, "trained": 64000, "buffered": 0})
    # The end's first key names both columns, whatever order the start's scores came in.
    sft["eval"] = {"start": {"tasks": 1000.0, "acc": 0.01234}, "end": {"acc": 0.5, "tasks": 1000.0}}
    grpo = st.stage_entry(summary, "grpo")
    grpo.update(
        steps=3,
        wall_s=9.6,
        updates_lost=1,
        experiences={
            "written": 266,
            "trained": 192,
            "buffered": 64,
            "dropped": {"untrainable": 2, "update_lost": 8},
        },
    )
    grpo["eval"] = {"start": {"acc": 0.5}}  # failed before its end eval

    lines = st.format_table(summary).split("\n")

    assert lines[0].split() == [
        "stage",
        "steps",
        "eval",
        "start",
        "eval",
        "end",
        "written",
        "trained",
        "buffered",
        "dropped",
        "wall",
        "s",
    ]
    assert lines[1] == "-" * len(lines[0])
    assert lines[2].split() == ["sft", "500", "0.012", "0.500", "0", "64000", "0", "0", "61"]
    assert lines[3].split() == ["grpo", "3", "0.500", "-", "266", "192", "64", "10", "10"]
    assert lines[4] == "grpo: dropped rows: untrainable 2, update_lost 8"
    assert lines[5].startswith("grpo: 1 optimizer steps lost in a trainer crash")
    assert lines[6] == "(eval columns: acc)"
    assert lines[7] == "acc: start 0.012 -> sft 0.500"  # grpo has no end score
    assert len(lines) == 8
    assert all(len(line) == len(lines[0]) for line in lines[2:4])  # columns line up


def test_format_table_without_eval_has_dashes_and_no_footnote() -> None:
    summary: dict = {"stages": []}
    st.stage_entry(summary, "only")
    lines = st.format_table(summary).split("\n")
    assert lines[2].split() == ["only", "0", "-", "-", "0", "0", "0", "0", "0"]
    assert len(lines) == 3
