"""email_search_workflow: the rubric reward by hand, preflight, and the tool loop through the real
OpenAI-compatible endpoint against a temporary SQLite mailbox (the judge is a stand-in client).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.common.config.buffer import FormatConfig
from services.common.errors import InvalidArgument
from services.explorer.runner import normalize_experience
from services.explorer.workflows.email_search import EmailSearchWorkflow, Rubric, rubric_reward
from tests.fakes.env_workflows import (
    decode,
    hide_packages,
    make_task,
    pretend_packages,
)

# --- email search ------------------------------------------------------------------------------------

INBOX = "pete.davis@enron.com"
EMAIL_RAW = {
    "id": 0,
    "question": "Were there any variances detected for hour 6 on 3/9/01?",
    "answer": "Yes, variances were detected for hour 6 on 3/9/01.",
    "message_ids": ["<m1@thyme>"],
    "how_realistic": 0.8,
    "inbox_address": INBOX,
    "query_date": "2001-03-16",
}


def build_email_db(path: Path) -> Path:
    """The prepare_data.py schema with three emails: one answers, one is too late, one is another inbox's."""
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE emails (id INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT UNIQUE, subject TEXT,
                             from_address TEXT, date TEXT, body TEXT, file_name TEXT);
        CREATE TABLE recipients (email_id INTEGER, recipient_address TEXT, recipient_type TEXT);
        CREATE VIRTUAL TABLE emails_fts USING fts5(subject, body, content='emails', content_rowid='id');
        """
    )
    rows = [
        (
            "<m1@thyme>",
            "Schedule variances",
            "ops@enron.com",
            "2001-03-16 09:00:00",
            "Variances detected in hour 6.",
        ),
        ("<m2@thyme>", "More variances", "ops@enron.com", "2001-03-17 09:00:00", "Variances again."),
        (
            "<m3@thyme>",
            "Variances elsewhere",
            "x@enron.com",
            "2001-03-10 09:00:00",
            "Variances for someone else.",
        ),
    ]
    for i, (mid, subject, sender, date, body) in enumerate(rows, start=1):
        conn.execute(
            "INSERT INTO emails (id, message_id, subject, from_address, date, body, file_name) VALUES (?,?,?,?,?,?,?)",
            (i, mid, subject, sender, date, body, f"f{i}"),
        )
        conn.execute("INSERT INTO emails_fts (rowid, subject, body) VALUES (?,?,?)", (i, subject, body))
        recipient = "someone@enron.com" if mid == "<m3@thyme>" else INBOX
        conn.execute("INSERT INTO recipients VALUES (?,?,?)", (i, recipient, "to"))
    conn.execute("INSERT INTO recipients VALUES (1, 'boss@enron.com', 'cc')")
    conn.commit()
    conn.close()
    return path


def test_email_rubric_reward_hand_worked() -> None:
    # right answer, cited, one source, 4 of 10 turns: format = 1 + 0.3 + 0.1 / 1 + 0.1 * (1 - 0.4) = 1.46
    right = Rubric(
        answer_correct=True,
        sources_correct=True,
        num_sources=1,
        num_turns=4,
        attempted_answer=True,
        ever_found_right_email=True,
        ever_read_right_email=True,
    )
    assert rubric_reward(right, 10) == {"accuracy": 1.0, "format": pytest.approx(1.46)}
    # right but uncited, two sources, all 10 turns: 1 + 0 + 0.05 + 0 = 1.05
    assert rubric_reward(Rubric(answer_correct=True, num_sources=2, num_turns=10), 10)[
        "format"
    ] == pytest.approx(1.05)
    # wrong answer after finding and reading the email: -1 with partial credit 0.2
    wrong = Rubric(attempted_answer=True, ever_found_right_email=True, ever_read_right_email=True)
    assert rubric_reward(wrong, 10) == {"accuracy": -1.0, "format": pytest.approx(0.2)}
    # Trinity checks "wrong" before "I don't know": an unaccepted "I don't know" is a wrong answer
    assert rubric_reward(Rubric(attempted_answer=True, returned_i_dont_know=True), 10) == {
        "accuracy": -1.0,
        "format": 0.0,
    }
    assert rubric_reward(
        Rubric(
            answer_correct=True, returned_i_dont_know=True, attempted_answer=True, ever_found_right_email=True
        ),
        10,
    ) == {"accuracy": 0.0, "format": pytest.approx(0.1)}
    assert rubric_reward(Rubric(), 10) == {"accuracy": 0.0, "format": 0.0}  # empty answer, not accepted


def test_email_preflight_names_the_database(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DEFAULT_EMAIL_DB_PATH", raising=False)
    pretend_packages(monkeypatch, "openai")
    [problem] = EmailSearchWorkflow.preflight({})
    assert "Enron email SQLite database" in problem and "DEFAULT_EMAIL_DB_PATH" in problem
    monkeypatch.setenv("DEFAULT_EMAIL_DB_PATH", str(tmp_path / "enron_emails.db"))
    [problem] = EmailSearchWorkflow.preflight({})
    assert f"{tmp_path}/enron_emails.db does not exist" in problem and "prepare_data.py" in problem
    db = build_email_db(tmp_path / "mine.db")
    assert EmailSearchWorkflow.preflight({"email_db_path": str(db)}) == []
    hide_packages(monkeypatch, "openai")
    assert "'openai'" in EmailSearchWorkflow.preflight({"email_db_path": str(db)})[0]


class FakeJudge:
    """An auxiliary model's OpenAI client: accepts every answer, records what it was asked."""

    model_path = "judge"

    def __init__(self, verdict: str = "true") -> None:
        self.asked: list[list[dict[str, str]]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))
        self.verdict = verdict

    def create(self, *, model: str, messages: list[dict[str, str]], **kwargs: Any) -> Any:
        self.asked.append(messages)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.verdict))])


def tool_call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_email_search_runs_the_tool_loop_through_the_openai_endpoint(make_model: Any, tmp_path: Path) -> None:
    db = build_email_db(tmp_path / "enron.db")
    replies = [
        tool_call("search_emails", inbox_address=INBOX, query_date="2001-03-16", keywords=["variances"]),
        "I should read it.",  # no tool call: the workflow reminds the model to finish
        tool_call("read_email", message_id="<m1@thyme>"),
        tool_call("generate_response", answer="Yes, in hour 6.", sources=["<m1@thyme>"]),
    ]
    model, scripted = make_model(replies, enable_history=True, tool_call_parser="hermes")
    judge = FakeJudge()
    task = make_task(
        "email_search_workflow", EMAIL_RAW, prompt_key="question", workflow_args={"email_db_path": str(db)}
    )
    task.format_args = FormatConfig(prompt_key="question", response_key="answer")
    exps = EmailSearchWorkflow(task=task, model=model, auxiliary_models=[judge]).run()
    assert [e.step for e in exps] == [0, 1, 2, 3]
    for exp in exps:
        normalize_experience(exp, 1)
    # accuracy 1 + format (1 + 0.3 cited + 0.1 / 1 source + 0.1 * (1 - 4 / 10)) = 2.46
    assert all(e.reward == pytest.approx(2.46) for e in exps)
    assert exps[0].metrics == {"actual_turns": 4.0, "accuracy": 1.0, "format": pytest.approx(1.46)}
    assert all(e.action_mask is not None and e.action_mask.all() for e in exps)
    # the search saw the inbox's mail up to the query date (m1, sent that day), not m2 (later) or m3 (another inbox)
    second_prompt = decode(model, scripted.prompts[1])
    assert '"message_id": "<m1@thyme>"' in second_prompt and "<m2@thyme>" not in second_prompt
    assert "<m3@thyme>" not in second_prompt
    assert "call `generate_response`" in decode(model, scripted.prompts[2])
    assert '"cc_addresses": ["boss@enron.com"]' in decode(model, scripted.prompts[3])
    [asked] = judge.asked
    assert asked[1]["content"] == (
        f"Question: {EMAIL_RAW['question']}\nReference answer: {EMAIL_RAW['answer']}\nAI answer: Yes, in hour 6."
    )


def test_email_search_without_an_answer_and_with_substring_scoring(make_model: Any, tmp_path: Path) -> None:
    db = build_email_db(tmp_path / "enron.db")
    model, _ = make_model(["Thinking."] * 2, enable_history=True, tool_call_parser="hermes")
    task = make_task(
        "email_search_workflow",
        EMAIL_RAW,
        prompt_key="question",
        workflow_args={"email_db_path": str(db), "max_turns": 2},
    )
    workflow = EmailSearchWorkflow(task=task, model=model, auxiliary_models=[FakeJudge()])
    exps = workflow.run()
    assert len(exps) == 2 and all(e.reward == -1.0 for e in exps)  # never answered: accuracy 0, format -1
    workflow.truth = "Yes, variances were detected."
    workflow.llm_as_a_judge = False
    assert workflow.score({"answer": "VARIANCES WERE", "sources": []}, turns=1) == {
        "accuracy": 1.0,
        "format": 0.0,
    }
    assert workflow.score({"answer": "no", "sources": []}, turns=1) == {"accuracy": 0.0, "format": 0.0}
    plain, _ = make_model([], enable_history=True)
    with pytest.raises(InvalidArgument, match="tool_call_parser"):
        EmailSearchWorkflow(task=task, model=plain)
