"""Reward functions: plain callables returning named reward parts; the reward is their sum.

`fn(response=..., truth=..., prompt=..., **reward_fn_args) -> dict[str, float] | float`. Classes
(Trinity's RewardFn, constructed once with reward_fn_args and then called) and plain functions
(TRL style) are both accepted; `resolve_reward` normalizes. Register with
`@REWARD_FUNCTIONS.register_module("name")` or name a dotted path in the config.

The package: this registry of the built-ins; `answers.py` the one answer reader (every reward reads
and compares answers there); `math_equiv.py` / `math_parse.py` the comparison of math answers under
it; `math.py` Trinity's math rewards; `shaped.py` the SmolLM2 demo's boxed_shaped_reward; `exact.py`
exact-match rewards; `countdown.py`; `rlcr.py` RLCR's calibrated-confidence reward; `rm_gallery.py`
RM-Gallery's reward models; `openjudge.py` OpenJudge's trajectory grader (an LLM judge).
A reward class may define `preflight(reward_fn_args) -> [problem]` (and `requires`): config check and
the explorer's start report what it names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.common.registry import Registry

REWARD_FUNCTIONS = Registry(
    "reward function",
    {
        "math_reward": "services.explorer.rewards.math:math_reward",
        "accuracy_reward": "services.explorer.rewards.math:AccuracyReward",
        "exact_match_reward": "services.explorer.rewards.exact:exact_match_reward",
        "countdown_reward": "services.explorer.rewards.countdown:countdown_reward",
        "arith_reward": "services.explorer.rewards.exact:arith_reward",
        "boxed_shaped_reward": "services.explorer.rewards.shaped:boxed_shaped_reward",
        "math_boxed_reward": "services.explorer.rewards.math:MathBoxedReward",
        "format_reward": "services.explorer.rewards.math:FormatReward",
        "math_dapo_reward": "services.explorer.rewards.math:MathDAPOReward",
        "rm_gallery_reward": "services.explorer.rewards.rm_gallery:RMGalleryReward",
        "rlcr_reward": "services.explorer.rewards.rlcr:RLCRReward",
        "trajectory_accuracy_grader_reward": "services.explorer.rewards.openjudge:TrajectoryAccuracyGraderReward",
        "openjudge_reward": "services.explorer.rewards.openjudge:TrajectoryAccuracyGraderReward",
    },
    config_key="default_reward_fn_type",
    plugin_hint="a module in explorer.plugin_dirs that registers it",
)


class RewardFn:
    """Base class for reward objects (Trinity's RewardFn): constructed with reward_fn_args, called per response."""

    def __call__(self, **kwargs: Any) -> dict[str, float]:
        raise NotImplementedError


def resolve_reward(spec: Any, args: dict[str, Any] | None = None) -> Callable[..., dict[str, float]]:
    """A RewardFn class is instantiated with `args`; a function gets `args` on every call."""
    args = args or {}
    if isinstance(spec, type):
        instance = spec(**args)
        return lambda **kw: _as_parts(instance(**kw))
    return lambda **kw: _as_parts(spec(**kw, **args))


def _as_parts(value: Any) -> dict[str, float]:
    if isinstance(value, dict):
        return {str(k): float(v) for k, v in value.items()}
    return {"reward": float(value)}
