"""intercode_sql_workflow: action parsing, the turn loop and reward against a scripted SqlEnv.

The episodes run on the real ModelWrapper over a scripted engine; the environment is a stand-in
with SqlEnv's interface (tests/fakes/intercode.py) injected through `make_env`. Preflight and
`trinity config check` name what the real environment needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.cli.config_check import check_file
from services.common.errors import InvalidArgument
from services.explorer.runner import normalize_experience
from services.explorer.workflows import WORKFLOWS
from services.explorer.workflows import intercode_sql as ic
from services.explorer.workflows.intercode_sql import (
    INTERCODE_SQL_SYSTEM_PROMPT,
    INVALID_ACTION,
    InterCodeSQLWorkflow,
    format_sql_observation,
    parse_sql_action,
    preprocess_sql,
    record_db,
)
from tests.conftest import REPO
from tests.fakes.env_workflows import decode, hide_packages, make_task, model_text, other_text, stand_in
from tests.fakes.intercode import ScriptedSqlEnv

RAW = {"query_idx": "3"}
ARGS = {"data_path": "~/ic/ic_spider_dev.json", "image_name": "docker-env-sql", "max_env_steps": 3}


def sql_task(**args: Any) -> Any:
    return make_task("intercode_sql_workflow", RAW, prompt_key="query_idx", workflow_args={**ARGS, **args})


def test_registered_under_trinitys_name() -> None:
    assert WORKFLOWS.get("intercode_sql_workflow") is InterCodeSQLWorkflow


def test_action_parsing_takes_the_first_complete_action() -> None:
    assert parse_sql_action("<think>x</think><action> SELECT 1;\n</action>") == "SELECT 1;"
    assert parse_sql_action("<action>submit</action><action>SELECT 2</action>") == "submit"
    assert parse_sql_action("<action>SELECT count(*)\nFROM t</action>") == "SELECT count(*)\nFROM t"
    assert parse_sql_action("<action>SELECT 1") == ""  # cut off: nothing is sent
    assert parse_sql_action("no tags") == ""


def test_record_db_and_preprocess() -> None:
    assert record_db({"db": "a"}) == "a"
    assert record_db({"extra": {"db": "b"}}) == "b"
    assert record_db({"extra": "x"}) == ""
    assert preprocess_sql({"db": "concert_singer"}) == ["use concert_singer"]
    assert (
        format_sql_observation([(6,)], "How many?", "c")
        == "Question: How many?\nDatabase: c\nObservation: [(6,)]"
    )


def test_query_solved_then_submitted(make_model: Any) -> None:
    replies = [
        "<think>count</think><action>SELECT count(*) FROM singer</action>",
        "<think>done</think><action>submit</action>",
    ]
    model, scripted = make_model(replies)
    env = ScriptedSqlEnv(
        [([(6,)], 0.0, False, {"action_executed": True}), ("", 1.0, True, {"action_executed": True})]
    )
    cls = stand_in(InterCodeSQLWorkflow, env)
    [exp] = cls(task=sql_task(), model=model).run()
    assert cls.made == [("docker-env-sql", str(Path("~/ic/ic_spider_dev.json").expanduser()), False)]
    normalize_experience(exp, 1)
    assert env.reset_indices == [3] and env.closed
    assert env.actions == ["SELECT count(*) FROM singer", "submit"]
    assert exp.reward == 1.0
    assert exp.metrics == {
        "query_idx": 3.0,
        "env_rounds": 1.0,  # the index of the round that finished
        "env_done": 1.0,
        "action_executed": 1.0,
        "final_reward": 1.0,
    }
    first = "Question: How many singers are there?\nDatabase: concert_singer\nObservation: "
    assert decode(model, exp.tokens[: exp.prompt_length]) == INTERCODE_SQL_SYSTEM_PROMPT + first
    assert model_text(model, exp) == "".join(r + "<eos>" for r in replies)
    assert other_text(model, exp) == first + "[(6,)]"
    assert len(scripted.prompts) == 2


def test_invalid_action_is_not_sent_and_the_question_is_auto_submitted(make_model: Any) -> None:
    replies = ["<action>SELECT name FROM singer</action>", "I think it is 6", "<action>SELECT 6</action>"]
    model, _ = make_model(replies)
    env = ScriptedSqlEnv(
        [
            ([("Joe",)], 0.0, False, {"action_executed": True}),
            ([(6,)], 0.0, False, {"action_executed": True}),
            ("", 0.5, True, {"action_executed": True}),  # the auto-submit's score
        ]
    )
    [exp] = stand_in(InterCodeSQLWorkflow, env)(task=sql_task(), model=model).run()
    assert env.actions == ["SELECT name FROM singer", "SELECT 6", "submit"]
    assert exp.reward == 0.5
    # Trinity's counters: not finished inside the loop -> env_rounds = max_env_steps; done after submit
    assert exp.metrics["env_rounds"] == 3.0 and exp.metrics["env_done"] == 1.0
    assert exp.metrics["final_reward"] == 0.5
    q = "Question: How many singers are there?\nDatabase: concert_singer\nObservation: "
    assert other_text(model, exp) == q + "[('Joe',)]" + q + INVALID_ACTION


def test_without_auto_submit_the_last_step_reward_stays(make_model: Any) -> None:
    model, _ = make_model(["<action>SELECT 1</action>", "nothing"])
    env = ScriptedSqlEnv([([(1,)], 0.25, False, {"action_executed": True})])
    task = sql_task(max_env_steps=2, auto_submit=False)
    [exp] = stand_in(InterCodeSQLWorkflow, env)(task=task, model=model).run()
    assert env.actions == ["SELECT 1"]  # the second reply had no action, nothing submitted
    assert exp.reward == 0.25
    assert exp.metrics["env_done"] == 0.0 and exp.metrics["action_executed"] == 0.0
    assert exp.metrics["env_rounds"] == 2.0


def test_data_path_is_required(make_model: Any) -> None:
    model, _ = make_model([])
    task = make_task("intercode_sql_workflow", RAW, prompt_key="query_idx", workflow_args={})
    with pytest.raises(InvalidArgument, match="data_path"):
        InterCodeSQLWorkflow(task=task, model=model)


def test_preflight_names_package_docker_and_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hide_packages(monkeypatch, "intercode")
    monkeypatch.setattr(ic.shutil, "which", lambda name: None)
    problems = InterCodeSQLWorkflow.preflight({"data_path": str(tmp_path / "missing.json")})
    assert len(problems) == 3, problems
    assert "needs the Python package 'intercode'" in problems[0] and "intercode-bench" in problems[0]
    assert "needs Docker" in problems[1] and "'docker-env-sql'" in problems[1]
    assert f"{tmp_path / 'missing.json'} does not exist" in problems[2]
    assert "workflow_args.data_path" in InterCodeSQLWorkflow.preflight({})[-1]


def test_config_check_names_what_the_v06_example_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_packages(monkeypatch, "intercode")
    path = REPO / "tests/data/trinity-v0.6-examples/grpo_intercode_sql/intercode_sql.yaml"
    _cfg, report = check_file(str(path), [])
    text = "\n".join(report.problems)
    assert "unknown workflow" not in text.lower()
    assert "InterCodeSQLWorkflow needs the Python package 'intercode'" in text
