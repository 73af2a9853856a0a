"""Per-turn rewards and streaming through a real serve-mode stack (buffer, synchronizer, the proxy as
processes on loopback), driven by the openai Python SDK: each turn's reward reaches the buffer on
that turn's last sampled token, a retried feedback changes nothing and a conflicting one is refused."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.integration.serve_proxy import Stack, make_stack, serve_config


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root: pathlib.Path = tmp_path_factory.mktemp("serve-turns")
    s = make_stack(root, serve_config(root))
    try:
        s.start_infra()
        s.start_proxy()
        yield s
    finally:
        s.stop_all()


def test_a_streamed_two_turn_session_gets_each_turn_s_reward_on_its_own_tokens(stack: Stack) -> None:
    client = stack.client()
    session = {"X-Session-Id": "turns-1"}
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "2+3="}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=session,
    )
    chunks = list(stream)
    said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    first_id, r1 = chunks[-1].id, chunks[-1].usage.completion_tokens
    assert chunks[-1].model_version == 0
    history = [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": said}]
    second = client.chat.completions.create(
        model="m",
        messages=[*history, {"role": "user", "content": "ok?"}],
        max_tokens=4,
        extra_headers=session,
    )
    r2 = second.usage.completion_tokens
    # a reward per turn, each in its own call; the first sent twice (an at-least-once client)
    turn_one = {"response_id": first_id, "reward": 0.25, "task_id": "turns"}
    assert stack.post("/feedback", turn_one)[1]["rewarded"] == [first_id]
    assert stack.post("/feedback", turn_one)[1]["unchanged"] == [first_id]
    assert stack.post("/feedback", {"response_id": second.id, "reward": 1.0})[1]["rewarded"] == [second.id]
    status, error = stack.post("/feedback", {"response_id": first_id, "reward": 0.5})
    assert status == 409 and error["error"]["param"] == "reward"
    # the group's other session (repeat_times 2): one turn, rewarded as a whole session
    client.completions.create(model="m", prompt="4+4=", max_tokens=3, extra_body={"session_id": "turns-2"})
    assert stack.post("/feedback", {"session_id": "turns-2", "reward": 0.0, "task_id": "turns"})[0] == 200
    status, body = stack.post("/commit", {"session_ids": ["turns-1", "turns-2"]})
    assert status == 200 and {c["group_state"] for c in body["committed"]} == {"written"}
    rows = {r.info["session_id"]: r for r in stack.read(2)}
    row = rows["turns-1"]
    gap = len("ok?")  # the builtin template concatenates contents: the user's text between the turns
    expected = [0.0] * (r1 + gap + r2)
    expected[r1 - 1], expected[-1] = 0.25, 1.0  # each turn's last sampled token
    assert row.token_level_rewards.tolist() == expected and row.reward == 1.25
    assert row.action_mask.tolist() == [True] * r1 + [False] * gap + [True] * r2
    assert row.info["turn_rewards"] == [0.25, 1.0] and row.info["response_ids"] == [first_id, second.id]
    assert rows["turns-2"].token_level_rewards.tolist() == [0.0] * len(rows["turns-2"].logprobs)
