"""Tokens as they are sampled: the real tiny model behind a BatchingEngine, two requests sharing a batch."""

from __future__ import annotations

import asyncio

from services.explorer.engines.base import BatchingEngine, SamplingParams
from services.explorer.engines.stream import TokenEvent, TokenStream
from services.explorer.engines.transformers_engine import TransformersEngine
from services.models.loading import load_causal_lm, load_tokenizer


async def test_each_request_gets_its_own_tokens_in_order_and_they_are_its_outputs() -> None:
    tok = load_tokenizer("builtin:tiny-arith")
    engine = TransformersEngine(
        load_causal_lm("builtin:tiny-arith"), eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id
    )
    batching = BatchingEngine(engine, gather_s=0.05)  # long enough for both requests to share one batch
    params = SamplingParams(n=2, max_tokens=5)
    try:
        one = TokenStream(batching, [tok.encode("1+2=")], params)
        two = TokenStream(batching, [tok.encode("30+4="), tok.encode("5+5=")], params)

        async def collect(stream: TokenStream) -> list[TokenEvent]:
            return [event async for event in stream.tokens()]

        got_one, got_two = await asyncio.gather(collect(one), collect(two))
        outs_one, outs_two = await one.outputs(), await two.outputs()
    finally:
        batching.close()
    assert batching.stats.batches == 1  # one batch of 2 + 4 sequences
    for events, outputs in ((got_one, outs_one), (got_two, outs_two)):
        flat = [o for per_prompt in outputs for o in per_prompt]  # row = prompt index * n + sample
        for row, out in enumerate(flat):
            mine = [e for e in events if e.row == row]
            assert [e.token_id for e in mine] == out.response_ids.tolist()  # the EOS too, nothing after
            assert [e.logprob for e in mine] == out.logprobs.tolist()
        assert {e.row for e in events} == set(range(len(flat)))
