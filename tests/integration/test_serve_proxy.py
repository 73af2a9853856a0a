"""mode serve against real processes (buffer, synchronizer, the explorer as the proxy) on loopback,
driven by the openai Python SDK and plain HTTP: what is recorded is what the engine saw, sessions
become experiences with assistant-only masks, feedback is idempotent, commits reach the buffer in
groups, every bad request is refused with OpenAI's JSON error and changes nothing."""

from __future__ import annotations

import pathlib
import signal
from collections.abc import Iterator

import numpy as np
import openai
import pytest

from services.explorer.engines.transformers_engine import sequence_logprobs
from services.models.loading import load_causal_lm, load_tokenizer
from tests.integration.serve_proxy import Stack, make_stack, serve_config

TOKENIZER = load_tokenizer("builtin:tiny-arith")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("serve")
    s = make_stack(root, serve_config(root))
    try:
        s.start_infra()
        s.start_proxy()
        yield s
    finally:
        s.stop_all()


def ids(text: str) -> list[int]:
    return list(TOKENIZER(text, add_special_tokens=False)["input_ids"])


def commit_pair(stack: Stack, task: str, first: str, second: str, reward: float = 1.0) -> list:
    """Reward and commit two sessions of one task (a group of repeat_times 2); the group's rows."""
    for sid, r in ((first, reward), (second, 0.0)):
        assert stack.post("/feedback", {"session_id": sid, "reward": r, "task_id": task})[0] == 200
    status, body = stack.post("/commit", {"session_ids": [first, second]})
    assert status == 200, body
    assert {c["group_state"] for c in body["committed"]} == {"written"}
    rows = stack.read(sum(c["experiences"] for c in body["committed"]))
    assert {r.group_id for r in rows} == {f"{task}#0"} and {r.task_id for r in rows} == {task}
    return rows


def test_the_sdk_gets_the_engine_s_tokens_and_logprobs_and_the_buffer_gets_the_same(stack: Stack) -> None:
    client = stack.client()
    assert client.models.list().data[0].id == "builtin:tiny-arith"
    reply = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "12+30="}],
        n=2,
        max_tokens=5,
        logprobs=True,
        extra_headers={"X-Session-Id": "sdk-1"},
    )
    assert reply.model_version == 0 and reply.system_fingerprint == "trinity-grpc-v0"  # the version it ran on
    streamed = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "7+5="}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"session_id": "sdk-2"},
    )
    chunks = list(streamed)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[-1].usage.completion_tokens >= 1
    rows = commit_pair(stack, "sdk", "sdk-1", "sdk-2")
    first, second = [r for r in rows if r.run_id == 0], [r for r in rows if r.run_id == 1]
    assert len(first) == 2 and len(second) == 1  # n=2: two chains in session sdk-1
    model = load_causal_lm("builtin:tiny-arith")
    for row in first:
        [choice] = [
            c for c in reply.choices if np.allclose([t.logprob for t in c.logprobs.content], row.logprobs)
        ]
        assert row.tokens[: row.prompt_length].tolist() == ids("12+30=")  # the prompt as rendered
        assert (
            TOKENIZER.decode(row.tokens[row.prompt_length :].tolist(), skip_special_tokens=True)
            == choice.message.content
        )
        assert row.logprobs.tolist() == pytest.approx([t.logprob for t in choice.logprobs.content])
        # and they are the model's own logprobs of those tokens (temperature 1): nothing re-tokenized
        np.testing.assert_allclose(
            sequence_logprobs(model, row.tokens.tolist(), row.prompt_length), row.logprobs, atol=1e-4
        )
        assert row.action_mask.all() and row.model_version == 0 and row.reward == 1.0
    assert second[0].response_text == text and second[0].reward == 0.0


def test_a_multi_turn_session_is_one_experience_masked_on_the_assistant_s_tokens(stack: Stack) -> None:
    client = stack.client()
    headers = {"X-Session-Id": "mt-1"}
    first = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "2+2="}], max_tokens=4, extra_headers=headers
    )
    said = first.choices[0].message.content
    history = [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": said}]
    second = client.chat.completions.create(
        model="m",
        messages=[*history, {"role": "user", "content": "sure?"}],
        max_tokens=4,
        extra_headers=headers,
    )
    client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "9+9="}],
        max_tokens=3,
        extra_headers={"X-Session-Id": "mt-2"},
    )
    rows = commit_pair(stack, "mt", "mt-1", "mt-2", reward=0.5)
    [row] = [r for r in rows if r.run_id == 0]
    r1, r2 = first.usage.completion_tokens, second.usage.completion_tokens
    # the builtin template concatenates contents: prompt "2+2=", then reply 1, "sure?", reply 2
    assert second.usage.prompt_tokens == len("2+2=") + r1 + len("sure?")
    assert row.prompt_length == len("2+2=") and len(row.tokens) == len("2+2=") + r1 + 5 + r2
    assert row.tokens[row.prompt_length + r1 : row.prompt_length + r1 + 5].tolist() == ids("sure?")
    assert row.action_mask.tolist() == [True] * r1 + [False] * 5 + [True] * r2
    assert row.logprobs[r1 : r1 + 5].tolist() == [0.0] * 5 and row.reward == 0.5
    assert row.info["turns"] == 2


def test_a_rewritten_history_is_split_and_counted(stack: Stack) -> None:
    client = stack.client()
    headers = {"X-Session-Id": "rw-1"}
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "3+3="}], max_tokens=3, extra_headers=headers
    )
    edited = [
        {"role": "user", "content": "3+3="},
        {"role": "assistant", "content": "6"},
        {"role": "user", "content": "ok"},
    ]
    client.chat.completions.create(model="m", messages=edited, max_tokens=3, extra_headers=headers)
    assert stack.post("/feedback", {"session_id": "rw-1", "reward": 1.0})[0] == 200
    status, body = stack.post("/commit", {"session_id": "rw-1"})
    [done] = body["committed"]
    assert status == 200 and done["splits"] == 1 and done["experiences"] == 2
    assert done["group_state"] is None and done["task_id"] == "rw-1"  # a group of 1 of 2: waits


def test_feedback_is_idempotent_and_a_conflict_is_refused(stack: Stack) -> None:
    reply = stack.client().completions.create(model="m", prompt="5+5=", max_tokens=3)
    body = {"msg_ids": [reply.id], "reward": 1.0, "task_id": "fb"}
    first, again = stack.post("/feedback", body), stack.post("/feedback", body)
    assert (
        first[0] == again[0] == 200
        and first[1]["rewarded"] == [reply.id]
        and again[1]["unchanged"] == [reply.id]
    )
    status, error = stack.post("/feedback", {**body, "reward": 0.0})
    assert status == 409 and error["error"]["type"] == "conflict_error"


BAD = [
    ("malformed JSON", "POST", "/v1/chat/completions", {"raw": b"{oops"}, 400, "invalid_request_error"),
    ("unknown route", "POST", "/v1/embeddings", {"body": {}}, 404, "not_found_error"),
    ("wrong method", "GET", "/v1/chat/completions", {}, 405, "invalid_request_error"),
    (
        "max_tokens over the limit",
        "POST",
        "/v1/chat/completions",
        {"body": {"model": "m", "messages": [{"role": "user", "content": "1"}], "max_tokens": 7}},
        400,
        "invalid_request_error",
    ),
    (
        "over-long prompt",
        "POST",
        "/v1/completions",
        {"body": {"model": "m", "prompt": "9" * 49}},
        400,
        "invalid_request_error",
    ),
    (
        "body over max_request_bytes",
        "POST",
        "/v1/completions",
        {"body": {"model": "m", "prompt": "9" * 5000}},
        413,
        "invalid_request_error",
    ),
    (
        "unsupported parameter",
        "POST",
        "/v1/chat/completions",
        {"body": {"model": "m", "messages": [{"role": "user", "content": "1"}], "stop": ["x"]}},
        400,
        "invalid_request_error",
    ),
    (
        "feedback for an unknown id",
        "POST",
        "/feedback",
        {"body": {"msg_ids": ["chatcmpl-nope"], "reward": 1}},
        404,
        "not_found_error",
    ),
    (
        "feedback without a reward",
        "POST",
        "/feedback",
        {"body": {"session_id": "x"}},
        400,
        "invalid_request_error",
    ),
    (
        "commit of an unknown session",
        "POST",
        "/commit",
        {"body": {"session_id": "ghost"}},
        404,
        "not_found_error",
    ),
]


@pytest.mark.parametrize(("why", "method", "path", "kwargs", "status", "kind"), BAD, ids=[b[0] for b in BAD])
def test_every_bad_request_gets_its_status_and_json_error_and_changes_nothing(
    stack: Stack, why: str, method: str, path: str, kwargs: dict, status: int, kind: str
) -> None:
    before = stack.stats()
    got, body = stack.call(method, path, kwargs.get("body"), raw=kwargs.get("raw"))
    assert got == status, body
    assert body["error"]["type"] == kind and body["error"]["message"]
    assert stack.stats() == before


def test_a_committed_session_takes_no_more_turns(stack: Stack) -> None:
    client = stack.client()
    headers = {"X-Session-Id": "closed-1"}
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "1+1="}], max_tokens=2, extra_headers=headers
    )
    stack.post("/feedback", {"session_id": "closed-1", "reward": 1.0})
    assert stack.post("/commit", {"session_id": "closed-1"})[0] == 200
    before = stack.stats()
    with pytest.raises(openai.ConflictError, match="committed"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "1+1="}], max_tokens=2, extra_headers=headers
        )
    assert stack.stats() == before


def test_sigkill_after_an_acknowledged_commit_loses_nothing(stack: Stack) -> None:
    client = stack.client()
    before = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "4+4="}],
        max_tokens=3,
        extra_headers={"X-Session-Id": "kill-1"},
    )
    stack.post("/feedback", {"msg_ids": [before.id], "reward": 1.0, "task_id": "kill"})
    status, body = stack.post("/commit", {"session_id": "kill-1"})
    assert (
        status == 200 and body["committed"][0]["group_state"] is None
    )  # acknowledged, waiting for its group
    unrewarded = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "8+8="}],
        max_tokens=3,
        extra_headers={"X-Session-Id": "kill-2"},
    )
    assert stack.stop("explorer", signal.SIGKILL) == -signal.SIGKILL
    stack.start_proxy()
    # the restarted proxy still knows the completion made before the kill, and the committed session
    assert stack.post("/feedback", {"msg_ids": [unrewarded.id], "reward": 0.0, "task_id": "kill"})[0] == 200
    status, body = stack.post("/commit", {"session_id": "kill-2"})
    assert status == 200 and body["committed"][0]["group"] == "kill#0"
    rows = stack.read(4, wait=5)
    assert sorted((r.info["session_id"], r.reward) for r in rows) == [("kill-1", 1.0), ("kill-2", 0.0)]
    assert rows[0].tokens[: rows[0].prompt_length].tolist() in (ids("4+4="), ids("8+8="))


def test_with_tls_and_a_bearer_token_only_verified_clients_with_the_token_get_in(
    tmp_path: pathlib.Path, certs: pathlib.Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t0ken\n")
    tls = {
        "cert_file": str(certs / "server.pem"),
        "key_file": str(certs / "server.key"),
        "ca_file": str(certs / "ca.pem"),
    }
    cfg = serve_config(tmp_path)
    cfg["services"] = {**cfg["services"], "tls": tls, "auth": {"token_file": str(token_file)}}
    s = make_stack(tmp_path, cfg)
    try:
        s.start_infra()
        url = s.start_proxy()
        assert url.startswith("https://")
        s.token, s.ca = "t0ken", str(certs / "ca.pem")
        reply = s.client().chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "1+1="}],
            max_tokens=2,
            extra_headers={"X-Session-Id": "tls-1"},
        )
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "1"}]
            )
        with pytest.raises(openai.APIConnectionError):  # a client that does not trust the CA
            openai.OpenAI(base_url=f"{url}/v1", api_key="t0ken", max_retries=0).models.list()
        s.token = None
        assert s.call("GET", "/health")[0] == 200  # health needs no token
        assert s.post("/feedback", {"session_id": "tls-1", "reward": 1.0})[0] == 401
        s.token = "t0ken"
        assert s.post("/feedback", {"msg_ids": [reply.id], "reward": 1.0})[0] == 200
        assert s.stats()["counters"]["completions"] == 1  # the refused request left nothing
    finally:
        s.stop_all()


def test_a_commit_while_the_buffer_is_down_is_acknowledged_and_written_once_it_is_back(
    tmp_path: pathlib.Path,
) -> None:
    cfg = serve_config(tmp_path, algorithm={"algorithm_type": "grpo", "repeat_times": 1})
    cfg["services"] = {**cfg["services"], "max_retries": 1}
    s = make_stack(tmp_path, cfg)
    try:
        s.start_infra()
        s.start_proxy()
        reply = s.client().completions.create(model="m", prompt="6+6=", max_tokens=3)
        assert s.post("/feedback", {"msg_ids": [reply.id], "reward": 1.0, "task_id": "down"})[0] == 200
        assert s.stop("buffer", signal.SIGKILL) == -signal.SIGKILL
        status, body = s.post("/commit", {})
        assert (
            status == 200 and body["committed"][0]["group_state"] == "pending"
        )  # durable here, not yet there
        s.start_healthy("buffer")
        rows = s.read(1, wait=30)  # the proxy's sweep writes it once the buffer is back
        assert [(r.task_id, r.reward) for r in rows] == [("down", 1.0)]
        assert s.read(1, wait=3) == []  # once: later sweeps write nothing more
        counters = s.stats()["counters"]
        assert counters["groups_written"] == 1 and counters["experiences_written"] == 1
    finally:
        s.stop_all()
