"""Peak memory of one GRPO training step with chunked logprobs vs the unchunked computation.

    .venv/bin/python benchmarks/trainer_memory.py [--quick] [--device cpu|cuda] [--layers N]
        [--model DIR] [--rows N --seq N --prompt N] [--gradient-checkpointing] [--chunk N]

The model: SmolLM2-135M's shape (Llama, vocabulary 49152, hidden 576, 9 heads / 3 KV heads,
intermediate 1536, tied embeddings) with fewer layers (default 2; the full model has 30), random
weights: the vocabulary-sized tensors, what chunking is about, are full size. One micro-batch of
4 rows x 512 tokens (32 prompt + 480 response), GRPO (no KL: no reference model), sampling
temperature 0.7, entropy as a metric. Ours: `trainer.logprob_chunk_size` 256 (the default).
Baseline: `logprob_chunk_size: null`, the same engine computing logprobs and entropy over the whole
micro-batch at once with plain torch ops (what the trainer did before). `--model DIR` measures a
real checkpoint instead (e.g. .cache/models/SmolLM2-135M-Instruct with `make demo-llm`'s micro-batch:
--rows 16 --seq 160 --prompt 96).

Each side runs in a fresh process (the allocator's cache and the process's peak are per process),
the two alternating, `--repeats` times each (default 1: the peaks move by about 1 % between runs):
one warm-up step (AdamW creates its state), then the measured step. The figure: the peak of the
measured step (CPU: the process's resident set, VmHWM reset before the step; CUDA:
`max_memory_allocated`), in MiB, the lowest over the repeats; its per-phase peaks
(memory/<phase>_peak_mb) and its wall and CPU seconds ride in the config. Last line: the JSON object
of benchmarks/README.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import pathlib
import sys
import time
from typing import Any

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
SMOLLM2 = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "tie_word_embeddings": True,
}


def one_side(chunk: int | None, args: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: build the engine, a warm-up step, then the measured step's peaks."""
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from services.common.config.algorithm import AlgorithmConfig
    from services.common.experience import Experience
    from services.trainer.algorithms import build_algorithm
    from services.trainer.batching import build_batch
    from services.trainer.engine import TrainEngine
    from services.trainer.settings import EngineSettings

    torch.manual_seed(0)
    if args["model"]:  # a real checkpoint (e.g. make model-smollm2's), float32 as the trainer loads it
        from services.models.loading import load_causal_lm

        model = load_causal_lm(args["model"], dtype="float32", device="cpu", seed=0)
    else:
        config = LlamaConfig(**SMOLLM2, num_hidden_layers=args["layers"], max_position_embeddings=args["seq"])
        model = LlamaForCausalLM(config)
    vocab = int(model.config.vocab_size)
    algorithm = build_algorithm(AlgorithmConfig(algorithm_type="grpo", kl_loss_fn="none"))
    settings = EngineSettings(
        micro_batch_size=args["rows"],
        lr=1e-5,
        temperature=0.7,
        logprob_chunk_size=chunk,
        gradient_checkpointing=args["gradient_checkpointing"],
    )
    engine = TrainEngine(model, algorithm, settings, device=args["device"])
    rng = np.random.default_rng(0)
    prompt, response = args["prompt"], args["seq"] - args["prompt"]

    def rows() -> list[Experience]:  # groups of two, rewards 1 and 0: every row trains
        return [
            Experience(
                tokens=rng.integers(4, vocab, prompt + response).astype(np.int64),
                prompt_length=prompt,
                model_version=0,
                reward=float(i % 2),
                logprobs=np.full(response, -2.0, dtype=np.float32),
                task_id=f"t{i // 2}",
            )
            for i in range(args["rows"])
        ]

    engine.train_step(build_batch(rows(), pad_token_id=0))  # warm-up: AdamW's state, lazy inits
    batch = build_batch(rows(), pad_token_id=0)
    if args["device"] == "cuda":
        torch.cuda.synchronize()
    start, cpu_start = time.perf_counter(), time.process_time()
    metrics = engine.train_step(batch)
    if args["device"] == "cuda":
        torch.cuda.synchronize()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    step = metrics["memory/step_peak_mb"]
    phases = {
        k.removeprefix("memory/").removesuffix("_peak_mb"): v
        for k, v in metrics.items()
        if k.endswith("_peak_mb") and k != "memory/step_peak_mb"
    }
    return {
        "step_peak_mb": step,
        "phases": phases,
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu_seconds, 2),  # barely moves with other load on a shared machine
        "loss": metrics["actor/loss"],
    }


def run_in_fresh_process(chunk: int | None, args: dict[str, Any]) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(one_side, chunk, args).result()


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="256 tokens a row, 1 repeat")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (SmolLM2-135M has 30)")
    parser.add_argument("--chunk", type=int, default=256, help="ours: trainer.logprob_chunk_size")
    parser.add_argument(
        "--repeats", type=int, default=1, help="fresh processes per side (the peaks barely move)"
    )
    parser.add_argument("--model", default="", help="a model directory instead (--layers is then unused)")
    parser.add_argument("--rows", type=int, default=4, help="rows of the one micro-batch")
    parser.add_argument("--seq", type=int, default=512, help="tokens a row (--quick: 256)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens of a row")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="on both sides")
    cli = parser.parse_args()
    args = {
        "device": cli.device,
        "model": cli.model,
        "layers": cli.layers,
        "rows": cli.rows,
        "seq": 256 if cli.quick else cli.seq,
        "prompt": cli.prompt,
        "gradient_checkpointing": cli.gradient_checkpointing,
    }
    repeats = 1 if cli.quick else cli.repeats
    sides: dict[str, list[dict[str, Any]]] = {"ours": [], "baseline": []}
    for i in range(repeats):  # alternate, so machine noise hits both alike
        order = [("ours", cli.chunk), ("baseline", None)]
        for name, chunk in order if i % 2 == 0 else order[::-1]:
            got = run_in_fresh_process(chunk, args)
            sides[name].append(got)
            print(
                f"{name}: step peak {got['step_peak_mb']:.0f} MiB, {got['seconds']} s "
                f"({got['cpu_seconds']} s CPU), phases {got['phases']}",
                file=sys.stderr,
                flush=True,
            )
    best = {name: min(runs, key=lambda r: r["step_peak_mb"]) for name, runs in sides.items()}
    ours, baseline = best["ours"]["step_peak_mb"], best["baseline"]["step_peak_mb"]
    losses = {name: r["loss"] for name, r in best.items()}
    result = {
        "name": "trainer_memory",
        "unit": "MiB",
        "ours": round(ours, 1),
        "baseline": round(baseline, 1),
        "baseline_name": "the same step with trainer.logprob_chunk_size null (whole-micro-batch log-softmax)",
        "ratio": round(ours / baseline, 4),
        "target_ratio": 0.75,
        "lower_is_better": True,
        "config": {
            "model": cli.model or f"Llama, SmolLM2-135M's shape with {cli.layers} layers, random weights",
            **({} if cli.model else SMOLLM2),
            **args,
            "logprob_chunk_size": cli.chunk,
            "repeats": repeats,
            "memory": "CUDA max_memory_allocated" if cli.device == "cuda" else "process peak RSS (VmHWM)",
            "logits_mb_per_copy": round(
                args["rows"] * (args["seq"] - args["prompt"] + 1) * SMOLLM2["vocab_size"] * 4 / 2**20, 1
            ),  # float32 [rows, response + 1, vocabulary] (SmolLM2's vocabulary)
            "ours_phases_mb": best["ours"]["phases"],
            "baseline_phases_mb": best["baseline"]["phases"],
            "ours_seconds": best["ours"]["seconds"],
            "baseline_seconds": best["baseline"]["seconds"],
            "ours_cpu_seconds": best["ours"]["cpu_seconds"],
            "baseline_cpu_seconds": best["baseline"]["cpu_seconds"],
            "same_loss": abs(losses["ours"] - losses["baseline"]) < 1e-5,
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "trainer_memory.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
