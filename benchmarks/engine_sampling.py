"""The transformers engine's sampling against transformers' own `generate`, same prompts, same run.

ours: TransformersEngine.generate_batch (the explorer's default engine): n samples per prompt, one
call, generated tokens/s. baseline: `model.generate(do_sample=True, num_return_sequences=n)` on the
same left-padded prompts with the same temperature, no top-k / top-p, the same max_new_tokens and
EOS, one call. Both sample; the figure is generated (non-padding) tokens per second. Rounds
alternate which side goes first; ours/baseline are medians and ratio the median of the per-round
ratios. Last line: the JSON result (also benchmarks/results/engine_sampling.json).

    python benchmarks/engine_sampling.py [--quick] [--model DIR|builtin:NAME] [--prompts 8] [--n 8]

The default model is SmolLM2-135M-Instruct from `make model-smollm2` (the demo-llm job: 8 questions
x 8 samples x 64 tokens), or builtin:tiny-30m where that is not there.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

SMOLLM2 = pathlib.Path(__file__).resolve().parent.parent / ".cache" / "models" / "SmolLM2-135M-Instruct"


def prompts_for(tok, count: int) -> list[list[int]]:
    questions = [
        f"What is {11 + i} + {31 + 2 * i}? Put your final answer in \\boxed{{}}." for i in range(count)
    ]
    if not getattr(tok, "chat_template", None):
        return [tok.encode(q) for q in questions]
    rendered = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in questions
    ]
    return [tok.encode(text, add_special_tokens=False) for text in rendered]


def ours(engine, prompts, params) -> int:
    groups = engine.generate_batch(prompts, params)
    return sum(len(o.response_ids) for group in groups for o in group)


def baseline(model, prompts, params, eos: int, pad: int) -> int:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=params.temperature,
            top_k=0,
            top_p=1.0,
            num_return_sequences=params.n,
            max_new_tokens=params.max_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    generated = out[:, width:]
    # tokens up to and including the first EOS of each row (generate pads after it)
    ended = (generated == eos).int().cumsum(-1)
    return int(((ended == 0) | ((ended == 1) & (generated == eos))).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(SMOLLM2) if SMOLLM2.is_dir() else "builtin:tiny-30m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="2 rounds, 16 tokens")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.max_tokens = 2, 16

    import torch

    from services.explorer.engines.base import SamplingParams
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer(args.model)
    model = load_causal_lm(args.model, dtype="float32").eval()
    eos, pad = (
        int(tok.eos_token_id),
        int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id),
    )
    engine = TransformersEngine(model, eos_token_ids=[eos], pad_token_id=pad, seed=0)
    prompts = prompts_for(tok, args.prompts)
    params = SamplingParams(n=args.n, temperature=0.7, top_p=1.0, max_tokens=args.max_tokens)
    ours(engine, prompts[:1], SamplingParams(n=2, max_tokens=4))  # warm-up, both paths
    baseline(model, prompts[:1], SamplingParams(n=2, max_tokens=4), eos, pad)
    ours_rates, base_rates, ratios = [], [], []
    for round_ in range(args.rounds):
        rates = {}
        for side in ("ours", "baseline") if round_ % 2 == 0 else ("baseline", "ours"):
            torch.manual_seed(round_)
            start = time.perf_counter()
            tokens = (
                ours(engine, prompts, params)
                if side == "ours"
                else baseline(model, prompts, params, eos, pad)
            )
            rates[side] = tokens / (time.perf_counter() - start)
        ours_rates.append(rates["ours"])
        base_rates.append(rates["baseline"])
        ratios.append(rates["ours"] / rates["baseline"])
        print(
            f"round {round_}: ours {rates['ours']:.0f} tokens/s, generate {rates['baseline']:.0f}", flush=True
        )
    result = {
        "name": "engine_sampling",
        "unit": "generated tokens/s",
        "ours": round(statistics.median(ours_rates), 1),
        "baseline": round(statistics.median(base_rates), 1),
        "baseline_name": "transformers model.generate(do_sample=True, num_return_sequences=n)",
        "ratio": round(statistics.median(ratios), 3),
        "target_ratio": 1.0,
        "config": {
            "model": args.model,
            "prompts": args.prompts,
            "n": args.n,
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "torch_threads": torch.get_num_threads(),
        },
    }
    out = pathlib.Path(__file__).resolve().parent / "results" / "engine_sampling.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
