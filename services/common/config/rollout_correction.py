"""`algorithm.rollout_correction`: off-policy correction between the rollout engine and the trainer.

Trinity-RFT v0.6 keeps `algorithm.rollout_correction` as a mapping that it hands to veRL, where it
becomes veRL's `RolloutCorrectionConfig` (verl/trainer/config/algorithm.py; the maths in
verl/trainer/ppo/rollout_corr_helper.py). The schema here is that dataclass's, key by key, with its
defaults: importance-sampling weights (`rollout_is*`, truncated or masked) and rejection sampling
(`rollout_rs*`) of tokens or sequences whose trainer/engine ratio is out of bounds. The tensor maths
is services/trainer/algorithms/rollout_correction.py. Threshold strings are parsed here, once, so a
bad one fails `trinity config check` with the key named.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

from pydantic import model_validator

from services.common.config.base import Section

# veRL's rejection-sampling criteria: statistic k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r of
# the per-token ratio r = pi_train / pi_rollout, taken per token or summed / averaged / maxed per row.
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


class Bounds(NamedTuple):
    """A threshold: keep lower <= value <= upper (lower None: upper bound only)."""

    lower: float | None
    upper: float


def _number(text: str, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{key}: {text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{key}: thresholds must be positive and finite, got {text!r}")
    return value


def parse_is_threshold(spec: float | str, key: str = "rollout_is_threshold") -> Bounds:
    """2.0 (or "2.0"): truncate weights at 2.0; "0.5_5.0": zero the weights outside [0.5, 5.0]."""
    text = str(spec).strip()
    if "_" not in text:
        return Bounds(None, _number(text, key))
    low, high = text.split("_", 1)
    bounds = Bounds(_number(low, key), _number(high, key))
    if bounds.lower is not None and bounds.lower > bounds.upper:
        raise ValueError(f"{key}: lower bound {bounds.lower} is above upper bound {bounds.upper}")
    return bounds


def parse_rs_thresholds(options: str, spec: float | str | None) -> dict[str, Bounds]:
    """Each rejection option -> its bounds. `spec` holds one entry per option (comma separated), or
    one for all. k1 options bound a ratio: "lower_upper", or one number u meaning [1/u, u]; k2 / k3
    options bound a divergence from above: one number."""
    names = list(dict.fromkeys(o.strip() for o in options.split(",") if o.strip()))
    unknown = [o for o in names if o not in RS_OPTIONS]
    if not names or unknown:
        raise ValueError(
            f"rollout_rs: unknown option(s) {unknown or [options]}; allowed (comma separated): "
            f"{', '.join(RS_OPTIONS)}"
        )
    if spec is None:
        raise ValueError("rollout_rs is set: give rollout_rs_threshold (one value, or one per option)")
    entries = [e.strip() for e in str(spec).split(",") if e.strip()]
    if len(entries) not in (1, len(names)):
        raise ValueError(
            f"rollout_rs_threshold: {len(entries)} values for {len(names)} rollout_rs options; give one "
            "value for all or one per option"
        )
    entries = entries * len(names) if len(entries) == 1 else entries
    out: dict[str, Bounds] = {}
    for name, entry in zip(names, entries, strict=True):
        key = f"rollout_rs_threshold ({name})"
        if name.endswith("k1"):
            bounds = parse_is_threshold(entry, key)
            out[name] = bounds if bounds.lower is not None else Bounds(1.0 / bounds.upper, bounds.upper)
        elif "_" in entry:
            raise ValueError(f"{key}: {name} bounds a divergence from above; give one number, not {entry!r}")
        else:
            out[name] = Bounds(None, _number(entry, key))
    return out


class RolloutCorrectionConfig(Section):
    """veRL's RolloutCorrectionConfig, as Trinity v0.6 passes `algorithm.rollout_correction` to it.

    The ratio corrected is r = pi_train / pi_rollout per response token: pi_rollout the engine's
    logprobs recorded with each experience; pi_train the trainer's old logprobs recomputed before the
    update (bypass off), or the policy being trained (bypass on, where old = rollout)."""

    rollout_is: Literal["token", "sequence"] | None = "sequence"
    """Importance-sampling weights: token (w_t = r_t; biased, low variance), sequence (every token of a
    row gets prod_t r_t; unbiased, high variance), or null (none; metrics and rollout_rs only).
    veRL's default sequence. With bypass off the weights multiply each token's policy loss; with bypass
    on and loss_type ppo_clip they are metrics only (PPO's ratio is already pi_train / pi_rollout)."""
    rollout_is_threshold: float | str = 2.0
    """A number u: truncated IS (TIS), weights clipped to at most u. A string "lower_upper" (e.g.
    "0.5_5.0"): masked IS (veRL's IcePop), weights outside [lower, upper] set to 0 (the token or row
    still counts in the loss's denominator)."""
    rollout_is_batch_normalize: bool = False
    """Divide the weights by their batch mean (of tokens for token, of rows for sequence) so they
    average 1."""
    rollout_rs: str | None = None
    """Rejection sampling: tokens or rows whose statistic is out of bounds leave the loss (mask 0, also
    out of its denominator). One option or a comma-separated list, all of which must pass: token_k1,
    token_k2, token_k3 (per token); seq_sum_k1/k2/k3, seq_mean_k1/k2/k3, seq_max_k2/k3 (the row's
    sum / mean / max of the token statistic; a failing row loses all its tokens). k1 = -log r (bounded
    as a ratio: token r, seq_sum prod r, seq_mean the geometric mean), k2 = (log r)^2 / 2, k3 =
    r - 1 - log r (bounded above). null: none."""
    rollout_rs_threshold: float | str | None = None
    """Bounds of rollout_rs, one entry per option (comma separated) or one for all: k1 options
    "lower_upper" ratio bounds, or one number u meaning [1/u, u]; k2 / k3 options one upper bound.
    Required when rollout_rs is set."""
    bypass_mode: bool | None = None
    """veRL's spelling of algorithm.bypass_old_logprobs (true: old logprobs are the engine's, two
    policies; false: recomputed, three). Unset: algorithm.bypass_old_logprobs decides; both given
    must agree."""
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"
    """Bypass mode only. ppo_clip: the configured policy loss, its ratio already pi_train / pi_rollout
    (IS weights are metrics). reinforce: veRL's IS-weighted REINFORCE, loss_t = -A_t * w_t *
    logprob_t with w the rollout_is weights (no clipping), in place of the ppo policy loss."""

    @model_validator(mode="after")
    def _thresholds_parse(self) -> RolloutCorrectionConfig:
        self.is_bounds  # noqa: B018 -- raises ValueError naming the key
        self.rs_bounds  # noqa: B018
        return self

    @property
    def is_bounds(self) -> Bounds:
        """rollout_is_threshold parsed: lower None for truncation, both for masking."""
        return parse_is_threshold(self.rollout_is_threshold)

    @property
    def rs_bounds(self) -> dict[str, Bounds]:
        """Each rollout_rs option -> its bounds ({} when rollout_rs is null)."""
        if self.rollout_rs is None:
            return {}
        return parse_rs_thresholds(self.rollout_rs, self.rollout_rs_threshold)
