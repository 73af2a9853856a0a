"""How the transformers engine spends its forward passes: the n samples of a prompt share one prefill,
and sequences that finished leave the batch; neither changes what a sequence's tokens and logprobs
are (services/explorer/engines/transformers_engine.py)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from services.explorer.engines.base import SamplingParams
from services.explorer.engines.transformers_engine import TransformersEngine, sequence_logprobs
from services.models.loading import build_builtin

# Half of tiny-arith's 100 ids end a sequence: with random weights the samples stop after 1 to ~6 tokens.
MANY_EOS = list(range(2, 100, 2))
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


def _record_batches(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(rows, positions) of every forward pass the model makes."""
    seen: list[tuple[int, int]] = []

    def hook(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        seen.append(tuple(kwargs["input_ids"].shape))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def _assert_scored_by(model: torch.nn.Module, outputs: list[Any]) -> None:
    for out in outputs:
        tokens = [*out.prompt_ids, *out.response_ids.tolist()]
        expected = sequence_logprobs(model, tokens, len(out.prompt_ids))
        np.testing.assert_allclose(out.logprobs, expected, atol=1e-4)


def test_the_samples_of_one_prompt_share_its_prefill():
    model = build_builtin("builtin:tiny-arith", seed=1)
    batches = _record_batches(model)
    engine = TransformersEngine(model, eos_token_ids=[2], pad_token_id=0, seed=3)
    groups = engine.generate_batch(PROMPTS, SamplingParams(n=4, max_tokens=6, temperature=1.0))
    assert batches[0] == (3, 4)  # one row per distinct prompt, left-padded to the longest
    assert batches[1][0] == 12 and batches[1][1] == 1  # then every sample decodes on its own row
    outputs = [o for group in groups for o in group]
    assert [o.prompt_ids for o in outputs] == [p for p in PROMPTS for _ in range(4)]
    assert len({tuple(o.response_ids.tolist()) for o in outputs}) > 3  # the samples differ
    _assert_scored_by(model, outputs)


def test_finished_sequences_leave_the_batch_and_the_rest_stream_to_the_right_rows():
    model = build_builtin("builtin:tiny-arith", seed=1)
    batches = _record_batches(model)
    engine = TransformersEngine(model, eos_token_ids=MANY_EOS, pad_token_id=0, seed=5)
    streamed: dict[int, list[int]] = {}
    groups = engine.generate_batch(
        PROMPTS,
        SamplingParams(n=8, max_tokens=12, temperature=1.0),
        on_token=lambda row, token, _lp: streamed.setdefault(row, []).append(token),
    )
    outputs = [o for group in groups for o in group]
    lengths = sorted(len(o.response_ids) for o in outputs)
    assert lengths[0] < lengths[-1]  # the samples stop at different tokens
    rows = [b[0] for b in batches[1:]]
    assert rows == sorted(rows, reverse=True) and rows[-1] < 24  # the batch shrinks, never grows
    # every decoding step computes at most the rows still generating after the step before
    for t, width in enumerate(rows, start=1):
        assert width <= sum(n > t - 1 for n in lengths) + 24 // 8
    assert {row: streamed[row] for row in range(24)} == {
        row: out.response_ids.tolist() for row, out in enumerate(outputs)
    }
    _assert_scored_by(model, outputs)


def test_weights_pushed_after_some_sequences_finished_reach_the_ones_still_generating():
    switch = 2
    old, new = build_builtin("builtin:tiny-arith", seed=1), build_builtin("builtin:tiny-arith", seed=2)
    reference = build_builtin("builtin:tiny-arith", seed=1)
    engine = TransformersEngine(old, eos_token_ids=MANY_EOS, pad_token_id=0, seed=5)

    def before_token(t: int) -> None:
        if t == switch:
            threading.Thread(target=engine.push_weights, args=(3, new.state_dict().items())).start()
            while not engine.pending_weights:
                pass

    engine.before_token = before_token
    groups = engine.generate_batch(PROMPTS, SamplingParams(n=8, max_tokens=10, temperature=1.0))
    outputs = [o for group in groups for o in group]
    assert any(len(o.response_ids) <= switch for o in outputs)  # finished before the push
    assert any(len(o.response_ids) > switch + 1 for o in outputs)  # and went on after it
    for out in outputs:
        n = len(out.response_ids)
        assert out.token_versions.tolist() == [0] * min(n, switch) + [3] * max(0, n - switch)
        tokens = [*out.prompt_ids, *out.response_ids.tolist()]
        before = sequence_logprobs(reference, tokens, len(out.prompt_ids))[:switch]
        after = sequence_logprobs(new, tokens, len(out.prompt_ids))[switch:]
        np.testing.assert_allclose(out.logprobs, np.concatenate([before, after]), atol=1e-4)
