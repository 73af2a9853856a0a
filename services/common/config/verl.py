"""`trainer.trainer_config`: Trinity's inline veRL config, leaf by leaf.

Every leaf of the mapping gets one of three meanings (RULES, first matching pattern wins):

- `same`: the setting exists here under another key; the leaf's value is used when that key is
  not set, and differing values for both are an error (`mapped_settings` gives them to the
  properties of TrainerConfig);
- `no effect`: a memory or speed knob of veRL whose value cannot change what is trained here
  (the reason is part of the rule);
- `rejected`: a value this project cannot honour, with the reason and what to use instead.

A leaf no rule matches is an error naming it: nothing in trainer_config is accepted and ignored.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from typing import Any, Literal, NamedTuple


class VerlRule(NamedTuple):
    pattern: str
    """Dotted leaf path, `*` for any part(s)."""
    kind: Literal["same", "no effect", "rejected"]
    detail: str
    """same: our key; no effect / rejected: the reason."""
    accepts: tuple[Any, ...] = ()
    """rejected: values that are fine anyway (e.g. offload False)."""


RULES: tuple[VerlRule, ...] = (
    VerlRule("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "same", "trainer.micro_batch_size"),
    VerlRule(
        "actor_rollout_ref.model.enable_gradient_checkpointing", "same", "trainer.gradient_checkpointing"
    ),
    VerlRule("trainer.max_actor_ckpt_to_keep", "same", "trainer.max_checkpoints_to_keep"),
    VerlRule("trainer.max_critic_ckpt_to_keep", "same", "trainer.max_checkpoints_to_keep"),
    VerlRule("critic.cliprange_value", "same", "algorithm.value_loss_fn_args.cliprange_value"),
    VerlRule(
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "no effect",
        "a forward-only batch size; the reference model's forwards use trainer.micro_batch_size",
    ),
    VerlRule(
        "critic.*micro_batch_size_per_gpu",
        "no effect",
        "the critic is batched with the actor (trainer.micro_batch_size)",
    ),
    VerlRule(
        "critic.*max_token_len_per_gpu",
        "no effect",
        "the critic is batched with the actor (trainer.max_token_len_per_gpu)",
    ),
    VerlRule(
        "actor_rollout_ref.model.use_remove_padding",
        "no effect",
        "a padding-free kernel choice; the same maths",
    ),
    VerlRule(
        "actor_rollout_ref.model.use_fused_kernels",
        "no effect",
        "veRL's fused logprob/entropy kernels: a kernel choice; the same maths",
    ),
    VerlRule(
        "actor_rollout_ref.model.fused_kernel_options.*",
        "no effect",
        "the backend of veRL's fused kernels (use_fused_kernels): a kernel choice; the same maths",
    ),
    VerlRule(
        "actor_rollout_ref.*.entropy_from_logits_with_chunking",
        "no effect",
        "logprobs and entropy are computed in blocks of trainer.logprob_chunk_size positions (the default)",
    ),
    VerlRule(
        "actor_rollout_ref.*.entropy_checkpointing",
        "no effect",
        "the chunked logprob/entropy keeps only the logits and recomputes each block in the backward pass",
    ),
    VerlRule(
        "actor_rollout_ref.hybrid_engine", "no effect", "trainer and explorer are separate services here"
    ),
    VerlRule(
        "*.checkpoint.save_contents",
        "no effect",
        "full checkpoints hold the model, optimizer and data cursor",
    ),
    VerlRule("*.checkpoint.load_contents", "no effect", "a resume loads the whole full checkpoint"),
    VerlRule(
        "trainer.balance_batch", "no effect", "balances lengths across data-parallel ranks; the same update"
    ),
    VerlRule(
        "*.ulysses_sequence_parallel_size",
        "rejected",
        "one sequence-parallel size for every model here: set trainer.ulysses_sequence_parallel_size",
        (1,),
    ),
    VerlRule(
        "*.fsdp_config.*_offload",
        "rejected",
        "CPU offload is not implemented: use trainer.gradient_checkpointing or a smaller max_token_len_per_gpu",
        (False,),
    ),
    # Trinity v0.5.2's place of v0.6's algorithm.bypass_old_logprobs (veRL's trainer read it there)
    VerlRule("algorithm.rollout_correction.bypass_mode", "same", "algorithm.bypass_old_logprobs"),
    VerlRule(
        "algorithm.rollout_correction.*",
        "rejected",
        "set it under algorithm.rollout_correction (Trinity v0.6's place of veRL's rollout correction)",
    ),
    VerlRule("critic.optim.lr", "same", "trainer.critic_lr"),
    VerlRule(
        "*.strategy", "rejected", "Megatron is not supported: use trainer.strategy fsdp2", ("fsdp", "fsdp2")
    ),
    VerlRule("*.megatron.*", "rejected", "Megatron is not supported: use trainer.strategy fsdp2"),
)


def leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, tree


def rule_for(path: str) -> VerlRule | None:
    return next((rule for rule in RULES if fnmatch.fnmatchcase(path, rule.pattern)), None)


def check_trainer_config(tree: dict[str, Any]) -> None:
    """Raise ValueError naming the first leaf with no meaning here or a value rejected."""
    for path, value in leaves(tree):
        rule = rule_for(path)
        key = f"trainer.trainer_config.{path}"
        if rule is None:
            raise ValueError(
                f"{key}: veRL key with no meaning here (known: see services/common/config/verl.py); "
                "use this project's key for it, or remove it"
            )
        if rule.kind == "rejected" and value not in rule.accepts:
            raise ValueError(f"{key} {value!r}: {rule.detail}")


def mapped_settings(tree: dict[str, Any] | None) -> dict[str, Any]:
    """Our key -> value of every `same` leaf (e.g. {"trainer.micro_batch_size": 2})."""
    out: dict[str, Any] = {}
    for path, value in leaves(tree or {}):
        rule = rule_for(path)
        if rule is not None and rule.kind == "same":
            if rule.detail in out and out[rule.detail] != value:
                raise ValueError(
                    f"trainer.trainer_config.{path} ({value!r}) disagrees with another veRL key for "
                    f"{rule.detail} ({out[rule.detail]!r})"
                )
            out[rule.detail] = value
    return out
