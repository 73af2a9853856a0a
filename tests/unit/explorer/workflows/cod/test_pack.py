"""CoD packs: packing a step's tasks by taskset, and one pack run through the real runner (the real
ModelWrapper over scripted replies), its rows then scored by the cod advantage operator."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.config.cod import CodConfig
from services.common.errors import InvalidArgument
from services.explorer.pipeline.cod import CodAdvantage
from services.explorer.runner import VersionRef, WorkflowRunner
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.cod.hints import HINT_END, HINT_START
from services.explorer.workflows.cod.pack import CodPackWorkflow, pack_seed, pack_tasks


def tasks(taskset: str, count: int, **changes: Any) -> list[Task]:
    return [
        Task(task_id=f"{taskset}{i}", index=i, taskset=taskset, raw_task={"seed": i}, **changes)
        for i in range(count)
    ]


def members(pack: Task) -> list[str]:
    return [t.task_id for t in pack.raw_task["cod_tasks"]]


def test_cod_packs_per_taskset_dropping_or_padding_the_tail() -> None:
    batch = tasks("a", 5) + tasks("b", 1)
    packs = pack_tasks(batch, CodConfig(task_pack_size=2))
    # a: [a0 a1] [a2 a3], a4 dropped; b: one task, fewer than a pack: dropped
    assert [members(p) for p in packs] == [["a0", "a1"], ["a2", "a3"]]
    assert all(p.workflow is CodPackWorkflow for p in packs) and packs[0].task_id == "pack0-a0"
    padded = pack_tasks(
        batch, CodConfig(task_pack_size=2, cod_workflow_args={"pad_tasks_to_full_pack": True})
    )
    assert [members(p) for p in padded] == [["a0", "a1"], ["a2", "a3"], ["a4", "a0"]]
    # evaluation packs use eval_task_pack_size
    assert [
        members(p)
        for p in pack_tasks(batch, CodConfig(task_pack_size=2, eval_task_pack_size=5), is_eval=True)
    ] == [["a0", "a1", "a2", "a3", "a4"]]


def test_ralph_strategies_repeat_one_task() -> None:
    batch = tasks("a", 4)
    sample = pack_tasks(batch, CodConfig(task_pack_size=2, packing_strategy="ralph_sample"))
    assert [members(p) for p in sample] == [["a0", "a0"], ["a2", "a2"]]
    full = pack_tasks(batch[:3], CodConfig(task_pack_size=2, packing_strategy="ralph_full"))
    assert [members(p) for p in full] == [["a0", "a0"], ["a1", "a1"], ["a2", "a2"]]
    # ralph_full keeps each repeat's environment index: task i of the batch -> i % pack size
    assert [t.raw_task["_env_task_idx"] for t in full[1].raw_task["cod_tasks"]] == [1, 1]


def test_pack_seeds() -> None:
    a, b = tasks("a", 2), tasks("a", 2)
    pack = pack_tasks(a, CodConfig(task_pack_size=2))[0]
    assert pack_seed(pack, a, stable=True) == pack_seed(pack, b, stable=True)  # same rows, same seed
    assert pack_seed(pack, a, stable=True) == pack_seed(pack, a[::-1], stable=True)  # order-free
    assert pack_seed(pack, a, stable=True) != pack_seed(pack, a[:1], stable=True)
    later = pack.copy_with(batch_id=pack.batch_id + 1)
    assert pack_seed(pack, a, stable=False) != pack_seed(later, a, stable=False)


def lake_tasks() -> list[Task]:
    return tasks(
        "lake",
        2,
        workflow=WORKFLOWS.get("cod_frozenlake_obscure_workflow"),
        workflow_name="cod_frozenlake_obscure_workflow",
        workflow_args={"desc": ["SG"], "agent_max_steps": 2, "mapping_mode": "per_pack"},
        repeat_times=2,
    )


def hint(text: str) -> str:
    return f"{HINT_START}\n- {text}\n{HINT_END}"


async def test_a_pack_run_solves_updates_hints_and_solves_again(make_model: Any) -> None:
    cod = CodConfig(
        task_pack_size=2,
        cod_workflow_args={"inject_pack_seed": True, "hint_penalty_coef": 0.1, "cod_log_interval": 1000},
    )
    (pack,) = pack_tasks(lake_tasks(), cod)
    seed = pack_seed(pack, pack.raw_task["cod_tasks"], stable=False)
    from services.explorer.workflows.cod.frozen_lake_obscure import mapping_by_seed

    right = next(code for code, way in mapping_by_seed(seed).items() if way == "Right")
    wrong = next(code for code, way in mapping_by_seed(seed).items() if way == "Left")
    # run 0: task 0 lost (Left, Left), hint parsed, task 1 won; run 1: task 0 won, hint unparsed, task 1 won
    # (the two runs go one after the other: one slot)
    replies = [f"<answer>Direction {wrong}</answer>"] * 2 + [hint("try another code")]
    replies += [f"<answer>Direction {right}</answer>", f"<answer>Direction {right}</answer>", "no hints"]
    replies += [f"<answer>Direction {right}</answer>"]
    model, engine = make_model(replies)
    runner = WorkflowRunner(
        lambda i: model, slots=1, max_timeout=60, max_retry_times=0, version_fn=VersionRef(3)
    )
    results = await runner.run_tasks([pack])
    exps = [e for r in results for e in r.experiences]
    assert [r.failure for r in results] == [None, None]
    kinds = [(e.run_id, e.info["exp_type"], e.info.get("task_idx", e.info.get("hint_idx"))) for e in exps]
    assert kinds == [
        (0, "solve_task", 0),
        (0, "solve_task", 0),
        (0, "gen_hint", 0),
        (0, "solve_task", 1),
        (1, "solve_task", 0),
        (1, "gen_hint", 0),
        (1, "solve_task", 1),
    ]
    assert exps[0].info["task_rewards"] == [0.0, 1.0] and exps[4].info["task_rewards"] == [1.0, 1.0]
    assert exps[0].info["total_reward"] == 1.0 and exps[4].info["total_reward"] == 2.0
    assert [exps[2].reward, exps[5].reward] == [0.0, pytest.approx(-0.1)]  # parsed vs unparsed hint
    assert exps[3].info["hint"] == "Hints: - try another code" and exps[0].info["hint"] == "Hints: null"
    assert exps[6].info["hint"] == "Hints: no hint available."
    assert exps[3].metrics["reward_iterative_hint_e2e_taskset_lake_pos_1"] == 1.0
    assert all(e.task_id == "pack0-lake0" and e.model_version == 3 for e in exps)
    for e in exps:
        e.group_id = e.task_id
    # cod advantage (mean returns to go): solve0 mean[0, 1] = 0.5 vs mean[1, 1] = 1 -> -0.25 / +0.25;
    # hint0 mean[0, 1] = 0.5 vs mean[-0.1, 1] = 0.45 -> +0.025 / -0.025; solve1 1 vs 1 -> 0
    scored, _ = CodAdvantage(iterative_hint_e2e_causal=True).process(exps)
    assert [float(e.advantages[0]) for e in scored] == pytest.approx(
        [-0.25, -0.25, 0.025, 0, 0.25, -0.025, 0]
    )


async def test_a_workflow_that_takes_no_hints_is_refused_by_name(make_model: Any) -> None:
    plain = tasks("m", 2, workflow=WORKFLOWS.get("math_workflow"), workflow_name="math_workflow")
    (pack,) = pack_tasks(plain, CodConfig(task_pack_size=2))
    model, _ = make_model([])
    with pytest.raises(InvalidArgument, match="'math_workflow' is not a CoD workflow"):
        await CodPackWorkflow(task=pack, model=model).run_async()


def test_the_packs_compression_mode_fills_in_for_tasksets_without_one() -> None:
    batch = lake_tasks()
    batch[1].workflow_args = {**batch[1].workflow_args, "context_compression_mode": "keep_all"}
    (pack,) = pack_tasks(
        batch, CodConfig(task_pack_size=2, cod_workflow_args={"context_compression_mode": "keep_answer"})
    )
    workflow = CodPackWorkflow(task=pack, model=None)
    assert [t.workflow_args["context_compression_mode"] for t in workflow.members] == [
        "keep_answer",
        "keep_all",
    ]


async def test_reused_episode_instances_are_reset_not_rebuilt(make_model: Any) -> None:
    cod = CodConfig(
        task_pack_size=2, cod_workflow_args={"reuse_workflow_instance": True, "cod_log_interval": 1000}
    )
    (pack,) = pack_tasks(lake_tasks(), cod)
    model, _ = make_model(["x", hint("h"), "x", "x", hint("h"), "x"])
    workflow = CodPackWorkflow(task=pack, model=model)
    await workflow.run_async()
    first = dict(workflow.episodes)
    await workflow.run_async()
    assert set(first) == {0, 1} and all(workflow.episodes[i] is first[i] for i in first)


async def test_runs_are_logged_as_json_every_cod_log_interval_steps(make_model: Any, tmp_path: Any) -> None:
    import json

    args = {"cod_log_interval": 2, "log_dir": str(tmp_path), "exp_name": "run"}
    (pack,) = pack_tasks(lake_tasks(), CodConfig(task_pack_size=2, cod_workflow_args=args))
    model, _ = make_model(["x", hint("h"), "x"] * 2)
    for step in (1, 2):  # steps 1, 3, 5, ... are logged
        await CodPackWorkflow(task=pack.copy_with(batch_id=step), model=model).run_async()
    (logged,) = list((tmp_path / "run").iterdir())
    assert logged.name == "rollout_step_1"
    (record,) = [json.loads(p.read_text()) for p in logged.iterdir()]
    assert [row["exp_type"] for row in record["steps"]] == ["solve_task", "gen_hint", "solve_task"]
    assert record["task_rewards"] == [0.0, 0.0] and record["steps"][1]["hint"] == "Hints: - h"
