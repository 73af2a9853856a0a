"""The engines test_trainer_ulysses.py compares: each case once under torchrun with Ulysses (every
rank runs this file) and once in the test's own process without it.

    torchrun --nproc_per_node 2 tests/integration/ulysses_cases.py OUT.pt

Cases: a tiny Llama with grouped-query attention (4 heads, 2 key/value heads) trained by GRPO with
a k2 KL loss against a reference model and an entropy bonus; the same Llama with one key/value head
(repeated to 2 before the all-to-all) trained by PPO with a Llama critic and gradient checkpointing;
the builtin GPT-2 by GRPO. Rows are 5 to 8 tokens long, so micro-batches of odd width are padded to
an even one for the split. With --nproc_per_node 4 the same cases run as two data-parallel groups
of two (each group one micro-batch) and give the same numbers (checked by hand, not in the suite).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from services.common.config.algorithm import AlgorithmConfig
from services.trainer.algorithms import build_algorithm
from services.trainer.batching import Batch, build_batch
from services.trainer.engine import TrainEngine
from services.trainer.modeling import ValueModel
from services.trainer.settings import EngineSettings
from tests.fakes.trainer import experience, tiny_model

CASES = ("llama-gqa-grpo", "llama-mqa-ppo", "gpt2-grpo")


def tiny_llama(kv_heads: int, seed: int) -> nn.Module:
    """A 2-layer Llama over the builtin tokenizer's vocabulary, weights from `seed` (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from services.models.loading import builtin_tokenizer

    config = LlamaConfig(
        vocab_size=len(builtin_tokenizer()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def batch() -> Batch:
    rows = [
        ("a", 1.0, "1+2=", "3"),
        ("a", 0.0, "1+2=", "33"),
        ("b", 1.0, "12+2=", "3;x"),
        ("b", 0.0, "7=", "333"),
    ]
    return build_batch([experience(p, r, task_id=t, reward=w) for t, w, p, r in rows], pad_token_id=0)


def engine(case: str, *, dist: Any = None, ulysses: int = 1) -> TrainEngine:
    kind, algorithm = case.rsplit("-", 1)
    if kind == "gpt2":
        models = [tiny_model(seed=s) for s in range(3)]
    else:
        models = [tiny_llama(2 if kind == "llama-gqa" else 1, seed=s) for s in range(3)]
    algo = build_algorithm(
        AlgorithmConfig(algorithm_type=algorithm, entropy_loss_fn_args={"entropy_coef": 0.01})
    )
    settings = EngineSettings(
        micro_batch_size=2,
        lr=1e-2,
        weight_decay=0.0,
        temperature=0.7,
        logprob_chunk_size=3,
        gradient_checkpointing=algorithm == "ppo",
        ulysses_size=ulysses,
    )
    return TrainEngine(
        models[0],
        algo,
        settings,
        ref_model=models[1],
        critic=ValueModel(models[2]) if algo.use_critic else None,
        dist=dist,
    )


def named_grads(eng: TrainEngine) -> dict[str, torch.Tensor]:
    """Every trainable's accumulated gradient, whole (a collective under FSDP)."""
    parts: dict[str, nn.Module] = {"policy": eng.model}
    if eng.critic is not None:
        parts["critic"] = eng.critic
    grads = {}
    for prefix, module in parts.items():
        for name, p in module.named_parameters():
            grad = p.grad
            assert grad is not None, name
            grads[f"{prefix}.{name}"] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad.detach()
    return grads


def run(case: str, *, dist: Any = None, ulysses: int = 1) -> dict[str, Any]:
    """One step of `case`: its metrics, gradients, updated weights, and what ran (attention, groups)."""
    eng = engine(case, dist=dist, ulysses=ulysses)
    metrics = eng.train_step(batch())
    config: Any = eng.model.config
    return {
        "metrics": metrics,
        "grads": named_grads(eng),
        "weights": eng.full_model_state(),
        "attention": config._attn_implementation,
        "groups": None if eng.sp is None else (eng.sp.size, eng.sp.rank, eng.sp.dp_size),
    }


def main(out: str) -> None:
    from services.trainer.distributed import init_distributed, leave_group

    ctx = init_distributed()
    results = {case: run(case, dist=ctx, ulysses=2) for case in CASES}
    if ctx.is_main:
        torch.save(results, out)
    leave_group()


if __name__ == "__main__":
    main(sys.argv[1])
