"""benchmarks/e2e.py's baseline: the same GRPO job on TRL's GRPOTrainer (a benchmark-only dependency)."""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from typing import Any


def run_trl(
    work: pathlib.Path, data: pathlib.Path, model_dir: pathlib.Path, args: argparse.Namespace
) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from services.explorer.rewards.exact import arith_reward
    from services.models.loading import load_causal_lm, load_tokenizer

    started = time.time()
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": r["question"], "answer": r["answer"]} for r in rows])

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        # TRL decodes completions up to the first EOS with special tokens skipped: the text before EOS.
        return [arith_reward(c, a)["accuracy"] for c, a in zip(completions, answer, strict=True)]

    step_times: list[float] = []

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_times.append(time.time())

    config = GRPOConfig(
        output_dir=str(work / "trl"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch * args.repeat,
        num_generations=args.repeat,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=load_causal_lm(str(model_dir), dtype="float32"),
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=load_tokenizer(str(model_dir)),
        callbacks=[StepClock()],
    )
    trainer.train()
    wall = time.time() - started
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"step_times": step_times, "rewards": rewards, "wall_s": wall}
