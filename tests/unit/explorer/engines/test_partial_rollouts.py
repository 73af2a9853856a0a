"""Partial rollouts in the transformers engine: weights pushed mid-generation are loaded between two
tokens and the in-flight sequences go on under them (services/explorer/engines/transformers_engine.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from services.common.errors import NotFound
from services.explorer.engines.base import BatchingEngine, SamplingParams
from services.explorer.engines.transformers_engine import TransformersEngine, sequence_logprobs
from services.models.loading import build_builtin

SWITCH_AT = 3  # the token index before which the new weights arrive
MAX_TOKENS = 8


def test_weights_pushed_mid_generation_continue_every_sequence_under_the_new_version():
    old, new = build_builtin("builtin:tiny-arith", seed=1), build_builtin("builtin:tiny-arith", seed=2)
    new_weights = {k: v.clone() for k, v in new.state_dict().items()}
    reference = build_builtin("builtin:tiny-arith", seed=1)  # `old` itself takes the new weights in place
    engine = TransformersEngine(old, eos_token_ids=[2], pad_token_id=0, seed=3)
    batching = BatchingEngine(engine, gather_s=0.0)
    reached, pushed = threading.Event(), threading.Event()

    def before_token(t: int) -> None:  # the test hook: hold token SWITCH_AT until the push is queued
        if t == SWITCH_AT:
            reached.set()
            assert pushed.wait(10)

    engine.before_token = before_token
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    params = SamplingParams(n=2, max_tokens=MAX_TOKENS, min_tokens=SWITCH_AT + 1, temperature=1.0)
    future = batching.submit(prompts, params)
    assert reached.wait(30)
    pusher = threading.Thread(target=batching.push_weights, args=(7, new_weights.items()))
    pusher.start()
    while not engine.pending_weights:  # queued: the generating batch takes it at the next token
        pass
    pushed.set()
    outputs = [o for group in future.result(30) for o in group]
    pusher.join(10)
    assert not pusher.is_alive() and engine.model_version == 7
    assert len(outputs) == 6
    for out in outputs:
        n = len(out.response_ids)
        # every sequence completed: max_tokens, or it ended on EOS (no token lost at the switch)
        assert n == MAX_TOKENS or (out.finish_reason == "stop" and out.response_ids[-1] == 2)
        assert out.token_versions is not None
        assert out.token_versions.tolist() == [0] * SWITCH_AT + [7] * (n - SWITCH_AT)  # both versions
        tokens = [*out.prompt_ids, *out.response_ids.tolist()]
        before = sequence_logprobs(reference, tokens, len(out.prompt_ids))[:SWITCH_AT]
        after = sequence_logprobs(new, tokens, len(out.prompt_ids))[SWITCH_AT:]
        # the tokens before the switch are the old weights', those after it the new weights'
        np.testing.assert_allclose(out.logprobs[:SWITCH_AT], before, atol=1e-4)
        np.testing.assert_allclose(out.logprobs[SWITCH_AT:], after, atol=1e-4)
    batching.close()


def test_weights_pushed_while_nothing_generates_load_at_once():
    engine = TransformersEngine(
        build_builtin("builtin:tiny-arith", seed=1), eos_token_ids=[2], pad_token_id=0
    )
    batching = BatchingEngine(engine)
    new = build_builtin("builtin:tiny-arith", seed=2)
    batching.push_weights(4, new.state_dict().items())
    assert engine.model_version == 4
    [[out]] = batching.generate([[5, 6]], SamplingParams(max_tokens=4, temperature=1.0))
    assert set(out.token_versions.tolist()) == {4}
    batching.close()


def test_weights_that_cannot_load_fail_the_push_and_leave_the_version():
    engine = TransformersEngine(
        build_builtin("builtin:tiny-arith", seed=1), eos_token_ids=[2], pad_token_id=0
    )
    batching = BatchingEngine(engine)
    with pytest.raises(NotFound, match="no_such.weight"):
        batching.push_weights(4, [("no_such.weight", torch.zeros(2))])
    assert engine.model_version == 0 and not engine.pending_weights
    batching.close()
