"""algorithm_type presets: fill the parts a user left unset, never override one the user set.

Values follow Trinity-RFT's AlgorithmType.default_config (trinity/algorithm/algorithm.py), with
Trinity's global fallbacks for keys a preset leaves open. Trinity's "warmup" sample strategy is
"default" here. SFT/DPO name the "none" advantage fn (Trinity skips the advantage step for them).
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
