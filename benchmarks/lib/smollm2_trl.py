"""benchmarks/smollm2_grpo.py's TRL side: the same SmolLM2 GRPO job on TRL's GRPOTrainer with its
default generation (transformers `generate`, no vLLM), a benchmark-only dependency."""

from __future__ import annotations

import time
from typing import Any


def run_trl(
    model_dir: str, steps: int, *, questions: int, samples: int, max_tokens: int, micro: int
) -> dict[str, Any]:
    """`steps` optimizer steps of `questions` x `samples` completions each; step finish times and rewards."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from services.explorer.rewards.shaped import boxed_shaped_reward
    from services.tasks.chat_arith import render_prompt, split_rows

    started = time.time()
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    train, _ = split_rows()
    rows = train[: steps * questions]
    # The prompt text ours sends (the chat template rendered with the generation prompt), in file order.
    dataset = Dataset.from_list([{"prompt": render_prompt(tok, r), "answer": r["answer"]} for r in rows])

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [boxed_shaped_reward(c, a)["reward"] for c, a in zip(completions, answer, strict=True)]

    step_times: list[float] = []

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_times.append(time.time())

    accumulation = questions * samples // micro
    config = GRPOConfig(
        output_dir="/tmp/smollm2-trl",  # nothing is saved (save_strategy no)
        max_steps=steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,  # one generation of questions x samples per optimizer step
        num_generations=samples,
        num_iterations=1,
        max_completion_length=max_tokens,
        temperature=0.7,
        top_k=0,
        top_p=1.0,
        learning_rate=1e-5,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.01,
        lr_scheduler_type="constant",
        warmup_steps=0,
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
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[StepClock()],
    )
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"times": step_times, "rewards": rewards, "wall_s": time.time() - started}
