"""mode serve on the real vLLM engine with SmolLM2-135M-Instruct's own chat template (ChatML): a
two-turn conversation through the openai SDK is one experience, linked without re-tokenizing what
was sampled, masked on the assistant's tokens, with vLLM's logprobs — the model's own."""

from __future__ import annotations

import pathlib

import numpy as np
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.explorer.engines.transformers_engine import sequence_logprobs
from tests.integration.serve_proxy import make_stack, serve_config


def test_a_two_turn_smollm2_conversation_is_one_experience_with_vllm_s_logprobs(
    smollm2: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    cfg = serve_config(
        tmp_path,
        model={"model_path": str(smollm2), "max_prompt_tokens": 160, "max_response_tokens": 24},
        explorer={
            "proxy_port": 0,
            "service_status_check_interval": 1,
            "rollout_model": {"engine_type": "vllm", "dtype": "float32", "max_model_len": 256},
        },
        algorithm={"algorithm_type": "grpo", "repeat_times": 1},
    )
    stack = make_stack(tmp_path, cfg)
    try:
        stack.start_infra()
        stack.start_proxy(timeout=300)
        client = stack.client()
        headers = {"X-Session-Id": "smol-1"}
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        first = client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=24, logprobs=True, extra_headers=headers
        )
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And of Italy?"},
        ]
        second = client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=24, logprobs=True, extra_headers=headers
        )
        assert stack.post("/feedback", {"session_id": "smol-1", "reward": 1.0})[0] == 200
        status, body = stack.post("/commit", {"session_id": "smol-1"})
        [done] = body["committed"]
        assert status == 200 and done["splits"] == 0 and done["experiences"] == 1, body
        [row] = stack.read(1)
        r1, r2 = first.usage.completion_tokens, second.usage.completion_tokens
        mask = row.action_mask.tolist()
        gap = len(mask) - r1 - r2  # the template's text between the replies: newline, user turn, header
        assert gap > 0 and mask == [True] * r1 + [False] * gap + [True] * r2
        sampled = [t.logprob for t in first.choices[0].logprobs.content + second.choices[0].logprobs.content]
        np.testing.assert_allclose(row.logprobs[row.action_mask], sampled, atol=1e-6)
        tokenizer = AutoTokenizer.from_pretrained(smollm2)
        fresh = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False)
        assert (
            row.tokens[: row.prompt_length].tolist()
            == tokenizer(fresh, add_special_tokens=False)["input_ids"]
        )
        model = AutoModelForCausalLM.from_pretrained(smollm2, torch_dtype="float32").eval()
        own = sequence_logprobs(model, row.tokens.tolist(), row.prompt_length)
        np.testing.assert_allclose(own[row.action_mask], row.logprobs[row.action_mask], atol=2e-3)
    finally:
        stack.stop_all()
