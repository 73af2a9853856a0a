"""cod_pde_discovery_workflow on scripted replies: the XML actions, a solved episode, a format error, an
episode that never commits, a pack run (shared data and evidence, the PDE hint update without the
reward), the names it is found under and what preflight reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.common.config.buffer import FormatConfig
from services.common.config.cod import CodConfig
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.cod.hints import HINT_END, HINT_START
from services.explorer.workflows.cod.pack import pack_tasks
from services.explorer.workflows.cod.pde.settings import PdeSettings, open_pack
from services.explorer.workflows.cod.pde.workflow import CodPdeDiscoveryWorkflow, parse_action

TRINITY_PATH = "trinity.common.workflows.connect_the_dots.pde_discovery.workflow.CoDPDEDiscoveryWorkflow"
ROW = {"seed": 3, "pde_environment_seed": 21, "task_desc": "Discover f(u).", "answer": ""}


@pytest.fixture
def args(tmp_path: Path) -> dict[str, Any]:
    family = tmp_path / "damping.json"
    family.write_text(json.dumps({"templates": [{"terms": ["u"], "signs": {"u": -1}}]}))
    return {
        "pde_state_abs_limit": 3.0, "initial_condition_shape": {"mode_count_range": [1, 1]},
        "ground_truth_family": str(family), "pde_grid_size": 17, "pde_time_steps": 51, "noise_level": 0.0,
        "point_budget": 6, "max_steps": 4, "dump_trajectories": False,
    }  # fmt: skip


def hidden_rate(args: dict[str, Any], row: dict[str, Any]) -> float:
    """The drawn c of f(u) = c u (the family's one template), as the environment draws it."""
    pack, _ = open_pack(PdeSettings.from_args(args), {**row, "task_idx": 0}, {})
    return pack.equation["u"]


def task(args: dict[str, Any], row: dict[str, Any] = ROW, index: int = 0) -> Task:
    return Task(
        workflow=WORKFLOWS.get(TRINITY_PATH), workflow_name=TRINITY_PATH, workflow_args=dict(args),
        raw_task=dict(row), task_id=f"pde{index}", index=index, taskset="pde",
        format_args=FormatConfig(prompt_key="task_desc", response_key="answer"),
    )  # fmt: skip


def answer(body: str) -> str:
    return f"Reasoning.\n<answer>\n{body}\n</answer>"


SAMPLE = answer('<sample_pde_data><point_grid><point x="0.25" t="0.1"/><point x="0.5" t="0.3"/>'
                '<point x="0.75" t="0.6"/></point_grid></sample_pde_data>')  # fmt: skip
REGRESS = answer(
    "<run_sparse_regression><dictionary><term>u</term><term>u**2</term></dictionary></run_sparse_regression>"
)


def commit(equation: str) -> str:
    return answer(f"<update_scientific_context><preferred_equation>{equation}</preferred_equation>"
                  "</update_scientific_context>")  # fmt: skip


def test_parse_action() -> None:
    assert parse_action(SAMPLE)[0] == "sample_pde_data"
    assert parse_action(SAMPLE)[1]["point_grid"]["point"][1] == {"x": "0.5", "t": "0.3"}
    body = (
        "<run_sparse_regression><dataset_id>ds_t1_1</dataset_id><candidate_equations><equation>1*u</equation>"
    )
    body += "</candidate_equations></run_sparse_regression>"
    assert parse_action(answer(body)) == (
        "run_sparse_regression",
        {"dataset_id": "ds_t1_1", "candidate_equations": ["1*u"]},
        "",
    )
    assert parse_action(answer("<summarize_pack_evidence/>")) == ("summarize_pack_evidence", {}, "")
    assert parse_action("no tags") == (None, None, "expected_exactly_one_answer_tag")
    assert parse_action(SAMPLE + SAMPLE)[2] == "expected_exactly_one_answer_tag"
    assert parse_action(answer("<a>text<b/></a>"))[2] == "invalid_answer_xml"
    assert parse_action(answer("<a><b>"))[2] == "invalid_answer_xml"


async def test_an_episode_samples_fits_and_commits_the_hidden_equation(
    make_model: Any, args: dict[str, Any]
) -> None:
    # f(u) = c u with noise 0: y = c u at the grid's nodes and, both being linear, between them, so the
    # regression returns c exactly (2 decimals) and committing it scores 1
    rate = hidden_rate(args, ROW)
    assert 0.5 <= -rate <= 2.0
    model, _ = make_model([SAMPLE, REGRESS, commit(f"{rate:.3g}*u")])
    exps = await CodPdeDiscoveryWorkflow(task=task(args), model=model).run_async()
    assert [e.step for e in exps] == [0, 1, 2] and all(e.reward == 1.0 for e in exps)
    first, second, last = (e.info["user_prompt"] for e in exps)
    assert "Task 1/1, step 1/4" in first and "Task: Discover f(u)." in first and "Datasets: none" in first
    assert "Point budget left: 3/6" in second and "Datasets: ds_t1_1" in second
    assert f"Best fit: f(u) = {rate:.3g}*u;" in last
    assert last.count("Errors at the sampled points: (x=0.25, t=0.1,") == 1
    assert exps[-1].info["feedback"] == (
        f"Latest sampled-data diagnostic: {exps[-1].metrics['pde_last_sampled_max_error']}\n"
        f"Latest finalized equation: {rate:.3g}*u\nLatest regression candidate: {rate:.3g}*u"
    )
    metrics = exps[-1].metrics
    assert metrics["pde_structure_recovery"] == 1.0 and metrics["pde_coefficient_relative_error"] == 0.0
    assert metrics["pde_sample_efficiency_points"] == 3.0 and metrics["pde_hidden_formula_reward_loss"] == 0.0
    assert (
        metrics["pde_structure_recovery_support_size_1"] == 1.0 and metrics["format_error_termination"] == 0.0
    )
    system = exps[0].messages[0].content
    assert "u_t = u_xx + f(u)" in system and "The hidden equation has 1 to 2\nterms" in system
    assert "u, u**2, u**3, u**4, u**5, u**7, sin(u), sin(2*u), exp(u)-1, log(1+u**2), tanh(u)" in system


async def test_a_reply_without_one_action_ends_the_task_with_0(make_model: Any, args: dict[str, Any]) -> None:
    model, _ = make_model(["I would sample near the middle."])
    exps = await CodPdeDiscoveryWorkflow(task=task(args), model=model).run_async()
    assert len(exps) == 1 and exps[0].reward == 0.0
    assert exps[0].metrics["format_error_termination"] == 1.0 and exps[0].info["pde_parse_error"] == (
        "expected_exactly_one_answer_tag"
    )
    assert exps[0].info["feedback"].startswith("Invalid format: a reply must hold exactly one XML action")


async def test_an_episode_that_never_commits_scores_0_and_old_feedback_is_compressed(
    make_model: Any, args: dict[str, Any]
) -> None:
    bad = answer('<sample_pde_data><point_grid><point x="2" t="0"/></point_grid></sample_pde_data>')
    model, engine = make_model([SAMPLE, commit("1*u"), bad, REGRESS])
    workflow = CodPdeDiscoveryWorkflow(task=task(args), model=model)
    exps = await workflow.run_async()
    assert len(exps) == 4 and all(e.reward == 0.0 for e in exps)
    assert "Error: run run_sparse_regression in this task" in exps[2].info["user_prompt"]
    assert (
        exps[-1].metrics["pde_structure_recovery"] == 0.0
        and exps[-1].metrics["pde_hidden_formula_reward_loss"] == 100.0
    )
    # after 4 steps the first two observations keep their status but not their action feedback
    users = [m["content"] for m in workflow.memory if m["role"] == "user"]
    assert "No action taken in this task yet." in users[0] and "Datasets: none" in users[0]
    assert users[1].endswith("Action feedback:\n[History compressed.]") and "Datasets: ds_t1_1" in users[1]
    assert "[History compressed.]" not in users[2] and "Error: run run_sparse_regression" in users[2]


async def test_a_pack_shares_data_and_evidence_and_hides_the_reward_from_the_hints(
    make_model: Any, args: dict[str, Any], tmp_path: Path
) -> None:
    rows = [{**ROW, "seed": 3}, {**ROW, "seed": 4}]
    tasks = [task(args, row, i) for i, row in enumerate(rows)]
    cod = CodConfig(
        task_pack_size=2,
        cod_workflow_args={"inject_pack_seed": True, "update_context_impl": "pde_update_context",
                           "log_dir": str(tmp_path), "cod_log_interval": 1000},
    )  # fmt: skip
    (pack,) = pack_tasks(tasks, cod)
    rate = hidden_rate(args, ROW)
    reveal = answer(
        "<summarize_pack_evidence><reveal_equations>true</reveal_equations></summarize_pack_evidence>"
    )
    replies = [SAMPLE, REGRESS, commit(f"{rate:.3g}*u"), f"{HINT_START}\n- f is linear\n{HINT_END}"]
    replies += [reveal, REGRESS, commit(f"{rate:.3g}*u"), SAMPLE]
    model, _ = make_model(replies)
    exps = await pack.workflow(task=pack, model=model).run_async()
    assert exps[0].info["task_rewards"] == [1.0, 0.0]
    hint_update = exps[3]
    assert hint_update.info["exp_type"] == "gen_hint"
    update_prompt = hint_update.messages[1].content
    assert "Reward:" not in update_prompt and "Latest finalized equation" in update_prompt
    second = [e for e in exps if e.info.get("task_idx") == 1]
    status = second[0].info["user_prompt"]
    assert "Task 2/2, step 1/4" in status and "Datasets: ds_t1_1" in status
    assert "Evidence committed by the previous task of the pack:\n- sampled points: 3" in status
    assert f"H1: tasks 1; recorded equation {rate:.3g}*u." in second[1].info["user_prompt"]
    # the first task's data fits in the second task, but committing needs a sample of its own
    assert f"Best fit: f(u) = {rate:.3g}*u;" in second[2].info["user_prompt"]
    assert "Error: sample data in this task" in second[3].info["user_prompt"]
    assert "Hints: - f is linear" in second[0].messages[0].content


def test_the_names_it_is_found_under_and_preflight(args: dict[str, Any]) -> None:
    assert (
        WORKFLOWS.get("cod_pde_discovery_workflow") is WORKFLOWS.get(TRINITY_PATH) is CodPdeDiscoveryWorkflow
    )
    assert CodPdeDiscoveryWorkflow.preflight(args) == []
    problems = CodPdeDiscoveryWorkflow.preflight({**args, "ground_truth_family": "physical_full_train.json"})
    assert len(problems) == 1 and problems[0].startswith(
        "workflow_args.ground_truth_family: 'physical_full_train.json' does not exist here"
    )
    problems = CodPdeDiscoveryWorkflow.preflight(
        {k: v for k, v in args.items() if k != "pde_state_abs_limit"}
    )
    assert problems == ["workflow_args.pde_state_abs_limit: pde_state_abs_limit is required (a number > 0.0)"]
    assert CodPdeDiscoveryWorkflow.preflight({**args, "min_reaction_terms": 2, "max_reaction_terms": 2})[
        0
    ].endswith("no template of 2 to 2 terms (workflow_args.min_reaction_terms / max_reaction_terms)")


async def test_trajectory_dumps(make_model: Any, args: dict[str, Any], tmp_path: Path) -> None:
    model, _ = make_model(["no action"])
    dumped = {**args, "dump_trajectories": True, "checkpoint_job_dir": str(tmp_path)}
    await CodPdeDiscoveryWorkflow(task=task(dumped, {**ROW, "uid": "pde train/7"}), model=model).run_async()
    (path,) = (tmp_path / "trajectory_dumps").iterdir()
    assert path.name.startswith("pde-21_pde_train_7_pos1_")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in events] == ["step", "final"] and events[0]["format_error"] is True
    assert events[1]["metrics"]["format_error_termination"] == 1.0
