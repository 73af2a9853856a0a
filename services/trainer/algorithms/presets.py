"""algorithm_type presets: fill the parts a user left unset, never override one the user set.

Values follow Trinity-RFT v0.5.2's AlgorithmType.default_config (trinity/algorithm/algorithm.py), with
Trinity's global fallbacks for keys a preset leaves open. Trinity's "warmup" sample strategy is a
registered alias of "default" here (its SFT warm-up steps are `stages` in this project); v0.5.2's
presets name "default" too. grpo_verl is kept as a type (GRPO with the grpo_verl advantage fn) because
issue 20 lists configs naming it; v0.5.2's algorithm.py has no such type. SFT/DPO/RAFT name the "none" advantage fn (Trinity skips the advantage step).

multi_step_grpo's advantage fn runs in the explorer (services/explorer/pipeline/step_wise.py);
on_policy_distill and jsd read the teacher logprobs the distillation workflows write (see
advantage/external_signal.py).
"""

from __future__ import annotations

from typing import Any

from services.common.config.algorithm import AlgorithmConfig
from services.common.errors import InvalidArgument

# Keys every resolved config has; a preset overrides some of them.
FALLBACK: dict[str, Any] = {
    "sample_strategy": "default",
    "advantage_fn": "ppo",
    "policy_loss_fn": "ppo",
    "kl_penalty_fn": "none",
    "kl_loss_fn": "k2",
    "entropy_loss_fn": "default",
}

_RL = {
    "kl_penalty_fn": "none",
    "kl_loss_fn": "k2",
    "entropy_loss_fn": "default",
    "sample_strategy": "default",
}

# No KL loss and no entropy term (asymre, sppo, on-policy distillation in Trinity).
_NO_REG = {**_RL, "kl_loss_fn": "none", "entropy_loss_fn": "none"}

PRESETS: dict[str, dict[str, Any]] = {
    "ppo": {**_RL, "repeat_times": 1, "advantage_fn": "ppo", "policy_loss_fn": "ppo", "use_critic": True},
    "grpo": {**_RL, "repeat_times": 2, "advantage_fn": "grpo", "policy_loss_fn": "ppo"},
    "opmd": {**_RL, "repeat_times": 2, "advantage_fn": "opmd", "policy_loss_fn": "opmd"},
    "rloo": {**_RL, "repeat_times": 2, "advantage_fn": "rloo", "policy_loss_fn": "ppo"},
    "reinforceplusplus": {
        **_RL,
        "repeat_times": 2,
        "advantage_fn": "reinforceplusplus",
        "policy_loss_fn": "ppo",
    },
    "gspo": {**_RL, "repeat_times": 2, "advantage_fn": "grpo", "policy_loss_fn": "gspo"},
    "cispo": {**_RL, "repeat_times": 2, "advantage_fn": "grpo", "policy_loss_fn": "cispo"},
    "mix": {
        "repeat_times": 8,
        "advantage_fn": "grpo",
        "policy_loss_fn": "mix",
        "sample_strategy": "mix",
        "entropy_loss_fn": "mix",
    },
    "mix_chord": {
        "repeat_times": 8,
        "advantage_fn": "grpo",
        "policy_loss_fn": "mix_chord",
        "sample_strategy": "mix",
        "entropy_loss_fn": "mix",
    },
    "grpo_verl": {**_RL, "repeat_times": 2, "advantage_fn": "grpo_verl", "policy_loss_fn": "ppo"},
    "multi_step_grpo": {**_RL, "repeat_times": 8, "advantage_fn": "step_wise_grpo", "policy_loss_fn": "ppo"},
    "topr": {**_RL, "repeat_times": 2, "advantage_fn": "reinforce", "policy_loss_fn": "topr"},
    "sapo": {**_RL, "repeat_times": 2, "advantage_fn": "grpo", "policy_loss_fn": "sapo"},
    "asymre": {**_NO_REG, "repeat_times": 2, "advantage_fn": "asymre", "policy_loss_fn": "opmd"},
    "sppo": {**_NO_REG, "repeat_times": 2, "advantage_fn": "opmd", "policy_loss_fn": "sppo"},
    "rec": {**_RL, "repeat_times": 2, "advantage_fn": "rec", "policy_loss_fn": "rec"},
    "on_policy_distill": {
        **_NO_REG,
        "repeat_times": 8,
        "advantage_fn": "on_policy_distill",
        "policy_loss_fn": "ppo",  # Trinity: or importance_sampling when no clipping is wanted
    },
    "jsd": {**_NO_REG, "repeat_times": 8, "advantage_fn": "jsd", "policy_loss_fn": "ppo"},
    "raft": {
        "sample_strategy": "default",
        "advantage_fn": "none",
        "policy_loss_fn": "sft",
        "kl_loss_fn": "none",
        "entropy_loss_fn": "none",
    },
    "sft": {
        "sample_strategy": "default",
        "advantage_fn": "none",
        "policy_loss_fn": "sft",
        "kl_loss_fn": "none",
        "entropy_loss_fn": "none",
    },
    "dpo": {
        "repeat_times": 2,
        "sample_strategy": "default",
        "advantage_fn": "none",
        "policy_loss_fn": "dpo",
        "kl_loss_fn": "k2",
        "entropy_loss_fn": "default",
    },
}


def resolve(cfg: AlgorithmConfig) -> AlgorithmConfig:
    """A copy of cfg with every part named: user's value > preset > fallback. cfg itself is untouched."""
    if cfg.algorithm_type not in PRESETS:
        raise InvalidArgument(
            f"unknown algorithm_type {cfg.algorithm_type!r}; allowed: {', '.join(sorted(PRESETS))}",
            field="algorithm.algorithm_type",
        )
    preset = {**FALLBACK, "use_critic": False, **PRESETS[cfg.algorithm_type]}
    user_set = cfg.model_fields_set
    updates = {}
    for key, value in preset.items():
        if key == "repeat_times":
            if "repeat_times" not in user_set:
                updates[key] = value
        elif getattr(cfg, key) is None:
            updates[key] = value
    return cfg.model_copy(update=updates)
