r"""How often SmolLM2-135M boxes its answer before any training: the task's wording vs the first one.

GRPO learns the boxed format only from groups in which some samples box and others do not. This
measures, with vLLM on the untrained model, the share of sampled replies (temperature 0.7, 8 per
question, as `make demo-llm` samples) that hold a non-empty `\boxed{}`, for the task set's wording
(services/tasks/chat_arith.py's QUESTION: "What is $63 + 2$? Give the final answer as a LaTeX
\boxed{} expression.") against the wording the project used first ("What is 63 + 2? Put your final
answer in \boxed{}."), on the same training questions. Also per wording: the share of flat groups
(all 8 samples scored alike by boxed_shaped_reward: no GRPO signal), the mean reward, and greedy
strict accuracy (the held-out "before" figure has to stay near 0). Higher is better. Run in
.venv-vllm (`make bench-vllm`).

    python benchmarks/smollm2_prompt_wording.py [--model .cache/models/SmolLM2-135M-Instruct] [--questions 96]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "gen")]

from services.tasks.chat_arith import FIRST_WORDING  # noqa: E402

SAMPLES, TEMPERATURE, MAX_TOKENS = 8, 0.7, 64


def measure(llm: Any, rows: list[tuple[int, int]], wording: str) -> dict[str, float]:
    """Sampled and greedy figures for one wording over `rows` (a, b)."""
    from vllm import SamplingParams

    from services.explorer.rewards.answers import last_boxed
    from services.explorer.rewards.shaped import shaped_score
    from services.tasks.chat_arith import render_prompt

    tok = llm.get_tokenizer()
    prompts = [render_prompt(tok, {"question": wording.format(a=a, b=b)}) for a, b in rows]
    truths = [str(a + b) for a, b in rows]
    t0 = time.perf_counter()
    sampled = llm.generate(
        prompts, SamplingParams(n=SAMPLES, temperature=TEMPERATURE, max_tokens=MAX_TOKENS), use_tqdm=False
    )
    greedy = llm.generate(
        prompts, SamplingParams(n=1, temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False
    )
    scores: list[float] = []
    boxed = flat = 0
    for out, truth in zip(sampled, truths, strict=True):
        group = [shaped_score(c.text, truth) for c in out.outputs]
        scores += group
        boxed += sum(bool(last_boxed(c.text)) for c in out.outputs)
        flat += len(set(group)) == 1
    strict = sum(shaped_score(o.outputs[0].text, t) == 1.0 for o, t in zip(greedy, truths, strict=True))
    return {
        "boxed_share": boxed / len(scores),
        "flat_groups": flat / len(rows),
        "reward_mean": sum(scores) / len(scores),
        "greedy_strict": strict / len(rows),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--questions", type=int, default=96)
    args = parser.parse_args()
    if not pathlib.Path(args.model, "config.json").is_file():
        sys.exit(f"--model {args.model}: no model there; `make model-smollm2` converts SmolLM2 offline")
    try:
        from vllm import LLM
    except ImportError:
        sys.exit("vLLM is not installed in this venv; run this in .venv-vllm (`make setup-vllm`)")
    from services.explorer.engines.vllm_engine import VLLMSettings, prepare_environment
    from services.tasks.chat_arith import QUESTION, split_rows

    prepare_environment(VLLMSettings(), on_gpu=False)
    train, _ = split_rows()
    operands = (re.findall(r"\d+", r["question"])[:2] for r in train[: args.questions])
    rows = [(int(a), int(b)) for a, b in operands]
    llm = LLM(args.model, dtype="float32", seed=0, enforce_eager=True, max_model_len=256)
    figures = {}
    for name, wording in (("first", FIRST_WORDING), ("task", QUESTION)):
        figures[name] = measure(llm, rows, wording)
        print(f"[smollm2_prompt_wording] {name}: {json.dumps(figures[name])}", file=sys.stderr, flush=True)
    result = {
        "name": "smollm2_prompt_wording",
        "unit": "share of sampled replies with a non-empty \\boxed{} (untrained model, T 0.7)",
        "ours": figures["task"]["boxed_share"],
        "baseline": figures["first"]["boxed_share"],
        "baseline_name": "the first wording: " + FIRST_WORDING.format(a=63, b=2),
        "ratio": figures["task"]["boxed_share"] / max(figures["first"]["boxed_share"], 1e-9),
        "target_ratio": 3.0,
        "config": {
            "model": args.model,
            "questions": len(rows),
            "samples": SAMPLES,
            "temperature": TEMPERATURE,
            "max_tokens": MAX_TOKENS,
            "task_wording": QUESTION.format(a=63, b=2),
            "figures": figures,
        },
    }
    out = ROOT / "benchmarks" / "results" / "smollm2_prompt_wording.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
