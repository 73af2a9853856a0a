"""Does computing from shared weights cost time? mode colocate's parameters vs ordinary ones, same run.

ours: the model's parameters moved into mapped files as mode colocate does it
(services/synchronizer/transfer/shared.py: tmpfs under /dev/shm where it has room), then a training
step's forward + backward and a sampling forward (no grad), as the trainer and the engine run them.
baseline: the same model, the same rows, its parameters in ordinary (anonymous) memory. Both live in
this process and the rounds alternate which goes first, so a busy machine slows both alike. The
model has SmolLM2-135M's shape (vocabulary 49152, hidden 576, 9 / 3 heads) with `--layers` layers,
random weights. Figure: median seconds of forward + backward, ours / baseline (lower is better);
the no-grad forward's medians ride in config. Last line: the JSON object of benchmarks/README.

    .venv/bin/python benchmarks/colocate_weights.py [--layers 30] [--rows 16] [--seq 160] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--seq", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.trainer_memory import SMOLLM2  # SmolLM2-135M's shape, as that benchmark builds it
    from services.synchronizer.transfer import shared

    torch.manual_seed(0)
    config = LlamaConfig(**SMOLLM2, num_hidden_layers=args.layers, max_position_embeddings=args.seq)
    plain = LlamaForCausalLM(config)
    mapped = LlamaForCausalLM(config)
    mapped.load_state_dict(plain.state_dict())
    size = sum(p.numel() * p.element_size() for p in mapped.parameters())
    with tempfile.TemporaryDirectory() as scratch:
        directory = shared.shared_dir(scratch, size)
        shared.share_parameters(mapped, directory, version=0)
        try:
            figures = measure(plain, mapped, args)
        finally:
            shared.remove_shared(directory)
    ours, base = figures["ours_train_s"], figures["baseline_train_s"]
    line = {
        "name": "colocate_weights",
        "unit": "s per forward + backward",
        "ours": round(statistics.median(ours), 4),
        "baseline": round(statistics.median(base), 4),
        "baseline_name": "the same model and rows, parameters in ordinary memory",
        "ratio": round(statistics.median(ours) / statistics.median(base), 4),
        "target_ratio": 1.05,
        "lower_is_better": True,
        "config": {
            **vars(args),
            "shared_in": "tmpfs" if directory.startswith("/dev/shm") else "disk",
            "mib": round(size / 2**20, 1),
            "sampling_forward_s": {
                "ours": round(statistics.median(figures["ours_sample_s"]), 4),
                "baseline": round(statistics.median(figures["baseline_sample_s"]), 4),
            },
            "rounds_s": {k: [round(v, 4) for v in vs] for k, vs in figures.items()},
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "colocate_weights.json").write_text(json.dumps(line) + "\n")
    print(json.dumps(line))


def measure(plain: Any, mapped: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    import torch

    ids = torch.randint(0, int(plain.config.vocab_size), (args.rows, args.seq))
    out: dict[str, list[float]] = {
        k: [] for k in ("ours_train_s", "baseline_train_s", "ours_sample_s", "baseline_sample_s")
    }

    def train(model: Any) -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    def sample(model: Any) -> None:
        with torch.no_grad():
            model(input_ids=ids)

    for model in (plain, mapped):  # warm-up: first-touch page faults, allocator caches
        train(model)
        sample(model)
    for i in range(args.rounds):
        sides = [("ours", mapped), ("baseline", plain)]
        for name, model in sides if i % 2 == 0 else sides[::-1]:
            out[f"{name}_train_s"].append(timed(lambda m=model: train(m)))
            out[f"{name}_sample_s"].append(timed(lambda m=model: sample(m)))
        print(
            f"round {i + 1}/{args.rounds}: train ours {out['ours_train_s'][-1]:.2f} s, "
            f"baseline {out['baseline_train_s'][-1]:.2f} s",
            file=sys.stderr,
            flush=True,
        )
    return out


if __name__ == "__main__":
    main()
