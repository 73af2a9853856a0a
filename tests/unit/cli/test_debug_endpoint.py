"""`trinity debug --endpoint`: the /completions request of token-id prompts and the reading of its reply.

The engine against a real server (the explorer's OpenAI API on the tiny model) is exercised by
tests/integration/test_debug_cli.py."""

from __future__ import annotations

import numpy as np
import pytest

from services.cli.debug_endpoint import completion_request, parse_completion
from services.common.errors import FailedPrecondition
from services.explorer.engines.base import SamplingParams


def choice(index: int, ids: list[int], logprobs: list[float], finish: str = "stop") -> dict:
    return {
        "index": index,
        "text": "ignored",
        "finish_reason": finish,
        "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": logprobs},
    }


def test_the_request_sends_token_ids_and_asks_for_ids_and_logprobs_back():
    params = SamplingParams(n=3, temperature=0.7, top_p=0.9, top_k=0, max_tokens=5, min_tokens=1)
    body = completion_request("m", [[1, 2], [3]], params)
    assert body == {
        "model": "m",
        "prompt": [[1, 2], [3]],
        "n": 3,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,  # no top-k filter, in vLLM's spelling
        "max_tokens": 5,
        "min_tokens": 1,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }
    assert completion_request("m", [[1]], SamplingParams(top_k=20))["top_k"] == 20


def test_choices_are_grouped_n_per_prompt_in_index_order():
    prompts = [[1, 2], [3]]
    reply = {  # vLLM numbers choices prompt * n + sample; the list itself may come in any order
        "choices": [
            choice(3, [9], [-0.4], "length"),
            choice(0, [5, 6], [-0.1, -0.2]),
            choice(2, [8], [-0.3]),
            choice(1, [7], [-1.5]),
        ]
    }
    outputs = parse_completion(reply, prompts, n=2)
    assert [[o.response_ids.tolist() for o in group] for group in outputs] == [[[5, 6], [7]], [[8], [9]]]
    assert [o.prompt_ids for group in outputs for o in group] == [[1, 2], [1, 2], [3], [3]]
    np.testing.assert_allclose(outputs[0][0].logprobs, [-0.1, -0.2])
    assert outputs[0][0].logprobs.dtype == np.float32 and outputs[0][0].response_ids.dtype == np.int64
    assert [o.finish_reason for o in outputs[1]] == ["stop", "length"]


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ({"choices": [choice(0, [5], [-0.1])]}, "1 choices for 1 prompt(s) x n=2"),
        (
            {"choices": [{"index": 0, "logprobs": {"tokens": ["hi"], "token_logprobs": [-1.0]}}] * 2},
            "returned the token 'hi' as text",
        ),
        ({"choices": [{"index": 0, "logprobs": None}] * 2}, "has no logprobs.tokens"),
        ({"choices": [choice(0, [5, 6], [-1.0]), choice(1, [5], [-1.0])]}, "one number per sampled token"),
        ({"choices": [choice(0, [5], [-1.0]), choice(1, [5], [None])]}, "one number per sampled token"),
    ],
)
def test_a_reply_without_token_ids_or_logprobs_is_refused_naming_what_is_missing(reply, message):
    with pytest.raises(FailedPrecondition) as info:
        parse_completion(reply, [[1]], n=2)
    assert message in str(info.value) and info.value.field == "--endpoint"
