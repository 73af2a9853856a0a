"""Partial rollouts on the vLLM engine (tiny Llama, in-process; the multiprocess engine runs the same
check in test_multiprocess.py): weights pushed while a batch generates load between two steps, and
every sequence goes on from the tokens it has, its KV cache prefilled again under the new weights
(services/explorer/engines/vllm_stream.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from services.explorer.engines.base import BatchingEngine, SamplingParams
from services.explorer.engines.vllm_engine import VLLMEngine
from tests.vllm.test_engine import PROMPTS, hf_logprobs

SWITCH_AT, MAX_TOKENS, VERSION = 5, 24, 7


def perturbed(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def check_push_mid_generation(engine: VLLMEngine, model: torch.nn.Module, *, lockstep: bool = True) -> None:
    """Push perturbed weights before token SWITCH_AT of a batch of 3 x 2 sequences (EOS banned by
    min_tokens) and check what each sequence holds; `model` holds the engine's weights before.
    `lockstep`: every row holds SWITCH_AT tokens at the switch (in-process, where all requests are
    scheduled in the first step); a multiprocess engine core starts stepping on the first request it
    receives, so a row may be a step behind the longest there."""
    new = perturbed(model, seed=11)
    batching = BatchingEngine(engine, gather_s=0.0)
    reached = threading.Event()

    def before_token(t: int) -> None:  # as mid_step.arm_hold: hold before SWITCH_AT until weights are pushed
        if t == SWITCH_AT:
            engine.before_token = None
            reached.set()
            while not engine.pending_weights:
                time.sleep(0.005)

    prompts = [*PROMPTS, PROMPTS[0][:3]]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS)
    uninterrupted = [o for group in engine.generate_batch(prompts, params) for o in group]
    assert all(o.token_versions.tolist() == [engine.model_version] * MAX_TOKENS for o in uninterrupted)
    old_version = engine.model_version
    events: list[tuple[int, int, float]] = []
    engine.before_token = before_token
    future = batching.submit(prompts, params, on_token=lambda *event: events.append(event))
    assert reached.wait(60)
    batching.push_weights(VERSION, new.items())  # returns once the generating batch loaded them
    outputs = [o for group in future.result(120) for o in group]
    assert engine.model_version == VERSION
    assert [len(o.response_ids) for o in outputs] == [len(o.response_ids) for o in uninterrupted]
    scores = engine.score_batch([[*o.prompt_ids, *o.response_ids.tolist()] for o in outputs])
    switches = []
    for row, (out, score) in enumerate(zip(outputs, scores, strict=True)):
        n, prompt = len(out.response_ids), out.prompt_ids
        assert n == MAX_TOKENS and out.finish_reason == "length"  # no token lost at the switch
        k = out.token_versions.tolist().count(old_version)  # the row's tokens at the switch
        assert out.token_versions.tolist() == [old_version] * k + [VERSION] * (n - k)
        switches.append(k)
        # before the switch: the old weights' logprobs; after it: the new weights' given the whole
        # prefix, which holds only if vLLM prefilled prompt + tokens so far again under them
        before = hf_logprobs(model, prompt, out.response_ids.tolist(), 1.0)[:k]
        np.testing.assert_allclose(out.logprobs[:k], before, atol=1e-4)
        np.testing.assert_allclose(out.logprobs[k:], score[len(prompt) - 1 + k :], atol=1e-4)
        streamed = [(t, lp) for r, t, lp in events if r == row]
        assert streamed == list(zip(out.response_ids.tolist(), out.logprobs.tolist(), strict=True))
    assert max(switches) == SWITCH_AT and (min(switches) == SWITCH_AT or not lockstep), switches
    # EOS allowed: each sequence ends at max_tokens or on its EOS, every token of the new version
    eos = engine.settings.eos_token_ids
    free = SamplingParams(n=4, temperature=1.5, max_tokens=MAX_TOKENS)
    for out in (o for group in engine.generate_batch(prompts, free) for o in group):
        n = len(out.response_ids)
        assert n == MAX_TOKENS or (out.finish_reason == "stop" and int(out.response_ids[-1]) in eos)
        assert set(out.token_versions.tolist()) == {VERSION}
    batching.push_weights(old_version, model.state_dict().items())  # nothing generating: loads at once
    assert engine.model_version == old_version and not engine.pending_weights


def test_weights_pushed_mid_generation_continue_every_sequence_under_them(tiny_engine, tiny_llama) -> None:
    check_push_mid_generation(tiny_engine, tiny_llama[1])
