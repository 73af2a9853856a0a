"""The vLLM engine's step loop (services/explorer/engines/vllm_stream.py) over a stand-in LLMEngine
(tests/fakes/llm_engine.py) whose every token is a known function of its prefix and the loaded
weights: weights pushed between two steps abort the running requests, load, and add each unfinished
row again from its prompt + tokens so far with the limits less what it has. The real vLLM: tests/vllm."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from services.common.errors import InvalidArgument
from services.explorer.engines.base import SamplingParams
from services.explorer.engines.vllm_stream import StepLoop, resume_limits
from tests.fakes.llm_engine import EOS, FakeHost, FakeLLMEngine, next_token

PROMPTS = [[5, 6, 7], [8, 9], [7], [10, 11, 12, 13]]  # [7]: EOS first under weights 0 (7*7 + 3 = 52 = 4*13)
OLD, NEW = 0, 9  # the fake's weights before and after the push
VERSION = 7


def sampling(max_tokens: int, min_tokens: int) -> SimpleNamespace:
    return SimpleNamespace(max_tokens=max_tokens, min_tokens=min_tokens)


def expected(prompt: list[int], params: SamplingParams, switch_at: int) -> tuple[list[int], list[float]]:
    """What a row holds: tokens before `switch_at` under OLD, after it under NEW, each given the whole
    prefix before it (EOS held back until min_tokens, a stop on EOS or at max_tokens)."""
    ids: list[int] = []
    lps: list[float] = []
    while len(ids) < params.max_tokens:
        token, lp = next_token([*prompt, *ids], OLD if len(ids) < switch_at else NEW)
        if token == EOS and len(ids) < params.min_tokens:
            token, lp = 3, -5.0
        ids.append(token)
        lps.append(lp)
        if token == EOS:
            break
    return ids, lps


def run_with_push_before(token: int, params: SamplingParams):
    engine = FakeLLMEngine(weights=OLD)
    host = FakeHost(engine)
    seen: list[int] = []
    events: list[tuple[int, int, float]] = []

    def before(t: int) -> None:
        seen.append(t)
        if t == token:
            host.push_weights(VERSION, [("w", NEW)])

    host.before_token = before
    outputs = StepLoop(engine, params, sampling, host, lambda *e: events.append(e)).run(PROMPTS)
    return engine, host, outputs, seen, events


def test_resume_limits_are_what_is_left_to_sample() -> None:
    params = SamplingParams(max_tokens=8, min_tokens=5)
    assert resume_limits(params, 0) == (8, 5)
    assert resume_limits(params, 3) == (5, 2)
    assert resume_limits(params, 6) == (2, 0)  # past min_tokens: 0, not -1
    assert resume_limits(SamplingParams(max_tokens=4), 1) == (3, 0)


def test_weights_pushed_mid_batch_continue_every_unfinished_row_from_its_tokens_so_far() -> None:
    params = SamplingParams(max_tokens=8, min_tokens=0)
    engine, host, outputs, seen, events = run_with_push_before(3, params)
    assert engine.weights == NEW and host.model_version == VERSION
    assert host.loads_with_requests_running == []  # the running requests were aborted first
    first = engine.added[: len(PROMPTS)]
    assert [(prompt, m, k) for _, prompt, m, k in first] == [(p, 8, 0) for p in PROMPTS]
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        ids, lps = expected(prompt, params, switch_at=3)
        assert out.response_ids.tolist() == ids and out.logprobs.tolist() == lps
        assert out.prompt_ids == prompt
        assert out.finish_reason == ("stop" if ids[-1] == EOS else "length")
        assert out.token_versions.tolist() == [0] * min(3, len(ids)) + [VERSION] * (len(ids) - 3)
    assert outputs[2].response_ids.tolist() == [EOS]  # finished at token 0: never added again
    running = [row for row, out in enumerate(outputs) if len(out.response_ids) > 3]  # at the switch
    assert len(running) >= 2
    assert sorted(engine.aborted) == sorted(first[row][0] for row in running)
    assert [(prompt, m, k) for _, prompt, m, k in engine.added[len(PROMPTS) :]] == [
        ([*PROMPTS[row], *outputs[row].response_ids.tolist()[:3]], 5, 0) for row in running
    ]
    # the hook saw each token index once per step, the switch at 3
    assert seen == list(range(max(len(o.response_ids) for o in outputs)))
    for row, out in enumerate(outputs):  # streamed: the same tokens, in order, under the flat row
        assert [(t, lp) for r, t, lp in events if r == row] == list(
            zip(out.response_ids.tolist(), out.logprobs.tolist(), strict=True)
        )


def test_min_tokens_carry_over_a_switch() -> None:
    params = SamplingParams(max_tokens=6, min_tokens=6)  # EOS banned: every row runs to 6 tokens
    engine, _, outputs, _, _ = run_with_push_before(2, params)
    assert [len(o.response_ids) for o in outputs] == [6] * len(PROMPTS)
    assert [(m, k) for _, _, m, k in engine.added[len(PROMPTS) :]] == [(4, 4)] * len(PROMPTS)
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        assert out.response_ids.tolist() == expected(prompt, params, switch_at=2)[0]


def test_weights_pushed_before_the_first_token_sample_the_whole_batch() -> None:
    params = SamplingParams(max_tokens=5, min_tokens=5)
    engine, _, outputs, _, _ = run_with_push_before(0, params)
    assert [(p, m, k) for _, p, m, k in engine.added[len(PROMPTS) :]] == [(p, 5, 5) for p in PROMPTS]
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        assert out.response_ids.tolist() == expected(prompt, params, switch_at=0)[0]
        assert set(out.token_versions.tolist()) == {VERSION}


def test_a_refused_load_fails_the_batch_and_the_push_with_nothing_left_running() -> None:
    engine = FakeLLMEngine(weights=OLD)
    host = FakeHost(engine)
    host.refuse[NEW] = InvalidArgument("weight 'w' has the wrong shape", field="weights")
    pushes = []

    def before(t: int) -> None:
        if t == 2:
            pushes.append(host.push_weights(VERSION, [("w", NEW)]))

    host.before_token = before
    with pytest.raises(InvalidArgument, match="wrong shape"):
        StepLoop(engine, SamplingParams(max_tokens=8, min_tokens=8), sampling, host).run(PROMPTS)
    [push] = pushes
    assert push.is_set() and push.error is host.refuse[NEW]
    assert not engine.has_unfinished_requests() and host.model_version == 0


def test_an_error_while_stepping_aborts_every_request() -> None:
    engine = FakeLLMEngine()
    host = FakeHost(engine)

    def before(t: int) -> None:
        if t == 2:
            raise RuntimeError("stop")

    host.before_token = before
    with pytest.raises(RuntimeError):
        StepLoop(engine, SamplingParams(max_tokens=8, min_tokens=8), sampling, host).run(PROMPTS)
    assert not engine.has_unfinished_requests()
