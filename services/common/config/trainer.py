"""`trainer:` — the torch training loop (Trinity-RFT's keys where they exist)."""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from services.common.config.base import Section, read_file_key
from services.common.config.verl import check_trainer_config, mapped_settings


class TrainerConfig(Section):
    name: str = "trainer"
    """Member name."""
    trainer_type: Literal["torch", "verl"] = "torch"
    """Training backend: this project ships one, a plain torch loop; `verl` (Trinity's default) runs
    that loop too, and the trainer says so in one line at start-up (veRL-only knobs have their own
    keys below or are rejected)."""
    enable_preview: bool = False
    """Trinity's rollout preview in its web UI. There is no UI here (TensorBoard and summary.json show the
    rollouts' metrics): true is accepted and the trainer says so in one line at start-up."""
    save_interval: int = Field(100, ge=1)
    """Full checkpoint (model, optimizer, step, data cursor) every this many steps."""
    total_steps: int | None = Field(None, ge=1)
    """Stop after this many steps (else at end of data)."""
    save_strategy: Literal["single_thread", "single_process", "single_node", "unrestricted"] = "unrestricted"
    """Accepted for Trinity compatibility."""
    micro_batch_size: int = Field(8, ge=1)
    """Experiences per forward/backward; gradients accumulate to train_batch_size. A memory setting,
    not an algorithm one: token-mean loss terms weigh each micro-batch by its share of the batch's
    action tokens, so the gradient is the same however the batch is split."""
    use_dynamic_bsz: bool = False
    """veRL's dynamic batch size: micro-batches are packed by a token budget (max_token_len_per_gpu)
    instead of a row count (micro_batch_size is then not used)."""
    max_token_len_per_gpu: int | None = Field(None, ge=1)
    """Token budget of one micro-batch with use_dynamic_bsz, counted as rows x padded length
    (prompt + response); a single longer row gets a micro-batch of its own. Unset with use_dynamic_bsz:
    2 x model.max_model_len (Trinity's default; resolved at load)."""
    ulysses_sequence_parallel_size: int = Field(1, ge=1)
    """Ulysses sequence parallelism (veRL's key): each sequence is split over this many ranks, which
    exchange heads for positions around attention (all-to-all), so a rank holds 1/N of every
    activation but attention's. Needs strategy fsdp2 under torchrun with a multiple of N ranks (the
    data-parallel size is ranks / N), a Llama, Qwen2, Qwen3 or GPT-2 (builtin) model whose attention
    heads N divides, with sdpa or eager attention; docs/sequence_parallel.md. With use_dynamic_bsz a
    micro-batch holds N x max_token_len_per_gpu tokens (veRL's rule)."""
    trainer_config: dict[str, Any] | None = None
    """Trinity's inline veRL config: each leaf is used for our equivalent key (when that key is not
    set), has no effect by design, or is rejected with the reason (services/common/config/verl.py)."""
    trainer_config_path: str | None = None
    """A veRL config YAML read as trainer_config (Trinity's key; give one of the two)."""
    grad_clip: float | None = Field(None, ge=0)
    """Trinity's key for the gradient-norm clip (algorithm.optimizer.grad_clip is the same setting;
    give one of them); 0 disables clipping."""
    critic_lr: float | None = Field(None, gt=0)
    """Learning rate of the critic (PPO's value model), with the policy's warmup and schedule;
    None: algorithm.optimizer.lr (veRL's critic.optim.lr is the same setting)."""
    critic_warmup: int = Field(0, ge=0)
    """Steps at the start that train only the critic (veRL's critic warm-up): the policy's weights stay
    as loaded until step critic_warmup + 1. Needs an algorithm with a critic (ppo)."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each batch."""
    gradient_checkpointing: bool = False
    """Activation checkpointing of the policy (and the critic): each layer's activations are
    recomputed in the backward pass instead of kept, trading compute for memory."""
    logprob_chunk_size: int | None = Field(256, ge=1)
    """Response positions whose log-probabilities and entropy are computed from the logits at a time:
    a micro-batch then keeps one [tokens, vocabulary] logits tensor and its gradient instead of several
    float32 copies (softmax, gradients of each op), and each block adds a few [chunk, vocabulary]
    temporaries. The same numbers either way; null: the whole micro-batch at once with plain torch
    ops (more memory). veRL's entropy_from_logits_with_chunking and entropy_checkpointing are the
    same idea."""
    bf16: bool = True
    """bf16 autocast on GPU (ignored on CPU)."""
    max_checkpoints_to_keep: int = Field(3, ge=1)
    """Full checkpoints kept; older ones are pruned."""
    replay_lost_updates: bool = True
    """Journal each step's rows on the trainer's disk until a checkpoint holds their update, so a
    trainer that crashes and resumes from an older checkpoint trains those rows again (no update
    lost). false: nothing is journaled, and a crash loses up to save_interval - 1 steps' updates
    (summary.json reports them as `updates_lost` and their rows as dropped, `update_lost`)."""
    read_timeout_s: float = Field(60.0, gt=0)
    """Seconds one batch read may wait before the trainer logs that it is starved and retries."""
    strategy: Literal["single", "fsdp2"] = "single"
    """single: one process (one GPU or CPU); fsdp2: torch FSDP2, started as
    `torchrun --nproc_per_node N -m services.trainer --config F` (rank 0 serves and talks to the other services)."""

    @model_validator(mode="before")
    @classmethod
    def _read_trainer_config_path(cls, data: Any) -> Any:
        return read_file_key(data, "trainer_config_path", "trainer_config", "trainer", _verl_tree)

    @model_validator(mode="after")
    def _check_trinity_keys(self) -> TrainerConfig:
        if self.trainer_config is not None:
            check_trainer_config(self.trainer_config)
            for key, value in mapped_settings(self.trainer_config).items():
                name = key.removeprefix("trainer.")
                if name in self.model_fields_set and getattr(self, name) != value:
                    raise ValueError(
                        f"{key} ({getattr(self, name)!r}) and its veRL spelling in trainer.trainer_config "
                        f"({value!r}) differ; give one of them"
                    )
        return self

    @property
    def tokens_per_micro_batch(self) -> int | None:
        """The token budget of a micro-batch, or None when micro-batches are counted in rows."""
        return self.max_token_len_per_gpu if self.use_dynamic_bsz else None

    def _from_verl(self, name: str) -> Any:
        """Our key `name`, or its veRL spelling in trainer_config when `name` is not set."""
        mapped = mapped_settings(self.trainer_config)
        if name not in self.model_fields_set and f"trainer.{name}" in mapped:
            return mapped[f"trainer.{name}"]
        return getattr(self, name)

    @property
    def effective_micro_batch_size(self) -> int:
        """micro_batch_size, or trainer_config's actor ppo_micro_batch_size_per_gpu."""
        return int(self._from_verl("micro_batch_size"))

    @property
    def effective_gradient_checkpointing(self) -> bool:
        """gradient_checkpointing, or trainer_config's model.enable_gradient_checkpointing."""
        return bool(self._from_verl("gradient_checkpointing"))

    @property
    def effective_critic_lr(self) -> float | None:
        """critic_lr, or trainer_config's critic.optim.lr."""
        value = self._from_verl("critic_lr")
        return None if value is None else float(value)

    @property
    def effective_checkpoints_to_keep(self) -> int:
        """max_checkpoints_to_keep, or trainer_config's trainer.max_actor_ckpt_to_keep."""
        return int(self._from_verl("max_checkpoints_to_keep"))


def _verl_tree(text: str) -> dict[str, Any]:
    """trainer_config_path's file: a YAML mapping of veRL keys."""
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"trainer.trainer_config_path: not YAML ({exc})") from exc
    if not isinstance(tree, dict):
        raise ValueError("trainer.trainer_config_path: expected a mapping of veRL keys")
    return tree
