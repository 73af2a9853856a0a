"""The vLLM engine streams: each token handed out as its step returns, the outputs made of the same
tokens, and greedy streaming gives what greedy `LLM.generate` gives (tiny Llama, in-process)."""

from __future__ import annotations

from services.explorer.engines.base import SamplingParams
from services.explorer.engines.vllm_engine import VLLMEngine
from services.models.loading import builtin_tokenizer

TOK = builtin_tokenizer()
PROMPTS = [TOK("12+34=")["input_ids"], TOK("hello")["input_ids"]]


def test_streamed_tokens_are_the_outputs_and_match_a_plain_generate(tiny_engine: VLLMEngine) -> None:
    seen: list[tuple[int, int, float]] = []
    greedy = SamplingParams(n=2, temperature=0.0, max_tokens=6, min_tokens=6)
    streamed = tiny_engine.generate_batch(PROMPTS, greedy, on_token=lambda *event: seen.append(event))
    plain = tiny_engine.generate_batch(PROMPTS, greedy)
    flat = [o for per_prompt in streamed for o in per_prompt]  # row = prompt index * n + sample
    assert len(seen) == sum(len(o.response_ids) for o in flat) == 4 * 6
    for row, out in enumerate(flat):
        mine = [e for e in seen if e[0] == row]
        assert [e[1] for e in mine] == out.response_ids.tolist()
        assert [e[2] for e in mine] == out.logprobs.tolist()
    for got, want in zip(flat, [o for per_prompt in plain for o in per_prompt], strict=True):
        assert got.response_ids.tolist() == want.response_ids.tolist()
        assert got.finish_reason == want.finish_reason == "length"
    # in steps (a token of every sequence per step), not one sequence after the other
    order = [e[0] for e in seen]
    assert order.index(1) < len(order) - 6  # row 1's first token came before row 0's last ones
