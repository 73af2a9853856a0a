"""`algorithm:` — which algorithm and which parts (Trinity-RFT's keys).

Parts left unset are filled when the section is validated, from the `algorithm_type` preset
(services/common/config/presets.yaml); a part the user set is never overridden.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from services.common.config.base import Section
from services.common.config.presets import algorithm_types, apply_preset
from services.common.config.rollout_correction import RolloutCorrectionConfig


class OptimizerConfig(Section):
    lr: float = Field(1e-6, gt=0)
    """Learning rate (Trinity default 1e-6)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = Field(0.01, ge=0)
    """AdamW weight decay."""
    lr_warmup_steps: int = Field(0, ge=0)
    """Linear warm-up steps (takes precedence over lr_warmup_steps_ratio when > 0)."""
    lr_warmup_steps_ratio: float = Field(0.0, ge=0, le=1)
    """Warm-up steps as a fraction of the total training steps."""
    warmup_style: Literal["constant", "cosine"] = "constant"
    """Schedule after warm-up."""
    lr_scheduler_type: Literal["constant", "cosine"] | None = None
    """Trinity v0.5's name of warmup_style (give one of them)."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Cosine schedule floor as a fraction of lr."""
    grad_clip: float = Field(1.0, ge=0)
    """Clip the global gradient norm to this value; 0 disables clipping."""

    @model_validator(mode="after")
    def _one_schedule_key(self) -> OptimizerConfig:
        if self.lr_scheduler_type is not None and "warmup_style" in self.model_fields_set:
            raise ValueError(
                "algorithm.optimizer.lr_scheduler_type and warmup_style are the same setting; give one of them"
            )
        return self

    @property
    def schedule(self) -> str:
        """The lr schedule after warm-up: lr_scheduler_type (Trinity v0.5) or warmup_style."""
        return self.lr_scheduler_type or self.warmup_style


class AlgorithmConfig(Section):
    algorithm_type: str = "ppo"
    """ppo, grpo, opmd, dpo, sft, mix, rloo, reinforceplusplus, gspo, cispo, mix_chord, raft, asymre,
    grpo_verl, topr, sapo, sppo, rec, multi_step_grpo, on_policy_distill, jsd, m2po, dapo, gigpo, cpt (presets
    in services/common/config/presets.yaml, applied when the config is loaded).
    cpt (Trinity v0.6) is continued pre-training: sft's loss over every token of plain text rows
    (buffer.trainer_input.experience_buffer, a file; the column is format.text_key), in mode train.
    dapo (Trinity v0.6) is GRPO's advantages and PPO's clipped loss without KL or reference model; the
    rest of DAPO comes from the YAML, as in Trinity's example: clip_range_high 0.28
    (policy_loss_fn_args), the operators mask_response_truncated and dapo_dynamic_sampling
    (data_processor.experience_pipeline; the explorer then refills each step, see
    explorer.max_num_gen_batches) and math_dapo_reward's overlong penalty (reward_fn_args).
    multi_step_grpo's and gigpo's advantages are computed by the explorer (one experience per model
    call, run and step ids; gigpo (Trinity v0.6) also reads each step's info env_state_hash and
    step_reward, which step_wise_alfworld_workflow sets); on_policy_distill and jsd need teacher logprobs (on_policy_distill_workflow and
    on_policy_distill_math_workflow with a teacher in explorer.auxiliary_models). dpo is per pair (the paper's
    loss, averaged over pairs); Trinity sums all chosen and all rejected rows of a micro-batch into one
    pair; the two agree for one pair per micro-batch."""
    repeat_times: int = Field(1, ge=1)
    """Rollouts per training task (GRPO/OPMD need > 1); unset: the preset's (grpo 2, mix 8, ppo 1, ...)."""
    sample_strategy: str | None = None
    """How the trainer reads experiences: default (alias warmup, Trinity's name; SFT warm-up is
    `stages` here), staleness_control, mix."""
    sample_strategy_args: dict[str, Any] | None = None
    """Arguments of the sample strategy: staleness_control (max_staleness), mix (expert_data_ratio 0.5,
    sft_dataset_name "sft_dataset" = key in buffer.trainer_input.auxiliary_buffers)."""
    advantage_fn: str | None = None
    """grpo, ppo, rloo, reinforceplusplus, opmd, none, reinforce, asymre, rec, grpo_verl, opmd_verl,
    asymre_verl, on_policy_distill and jsd (teacher logprobs), step_wise_grpo (computed by the
    explorer; rows without advantages are scored from their run/step ids), gigpo (computed by the
    explorer from each step's anchor state; rows without advantages are refused), cod (Trinity v0.6's
    Connect-the-Dots reward-to-go credit over a CoD pack's episodes, computed by the explorer; needs
    the cod: section), or a dotted path
    "pkg.module:fn". Also accepted, failing at the first batch with the missing data named: remax
    (greedy baseline reward), clipb and clipv (per-token entropy)."""
    advantage_fn_args: dict[str, Any] | None = None
    """Arguments of the advantage fn: grpo (epsilon 1e-6, std_threshold, std_cal_level group|batch),
    ppo (gamma 1.0, lam 1.0), reinforceplusplus (gamma), opmd (opmd_baseline mean|logavgexp, tau),
    asymre (baseline_shift -0.1), rec (epsilon 1e-6, std_normalize false, drop null|balance),
    on_policy_distill (kl_coef 1.0), jsd (kl_coef 1.0, lambda_coef 0.5), step_wise_grpo (epsilon 1e-6,
    enable_step_norm false, std_cal_level group|batch|none, std_threshold), gigpo (omega 1.0, gamma 1.0,
    fnorm none|std, epsilon 1e-6, step_reward_key step_reward, env_state_hash_key env_state_hash), cod
    (step_wise_grpo's, and iterative_hint_e2e_causal false, e2e_causal_returns_style
    mean|sliding_window_mean|discounted, e2e_causal_returns_window -1, e2e_causal_returns_gamma 1.0,
    e2e_causal_baseline group-mean, red_weight_temp, red_weight_adaptive_temp false,
    red_weight_adaptive_version bisection, red_weight_adaptive_level task|taskset, red_weight_adv_shift
    false, mask_format_issue_exp: no effect, as in Trinity), clipb (epsilon 1e-6, mu 2.5),
    clipv (epsilon 1e-6, mu 8.5, max_frac 1e-4)."""
    policy_loss_fn: str | None = None
    """ppo, gspo, cispo, opmd, sft, dpo, mix, mix_chord, sft_is, sft_phi, topr, sppo, rec,
    importance_sampling, sapo, m2po."""
    policy_loss_fn_args: dict[str, Any] | None = None
    """Arguments of the policy loss, Trinity v0.5.2's names: ppo (clip_range 0.2, clip_range_low/high,
    clip_ratio_c 3.0, loss_agg_mode, enable_sequence_masking false, delta_sequence_masking 0.1,
    fallback_to_policy_gradient false); dpo (beta 0.1, label_smoothing 0.0); opmd (tau 1.0); mix (mu 0.1,
    grpo_loss_agg_mode and sft_loss_agg_mode token-mean, and Trinity's batch-size arguments, accepted
    and unused since the weights come from the real row counts); mix_chord (mu_warmup_steps 0,
    mu_decay_steps 0, mu_peak 0.1, mu_valley 0.1, enable_phi_function true, clip_range 0.2); sft_is /
    sft_phi (use_token_level_loss true; sft_phi cutoff_prob 1.0); topr (advantage_threshold 0.0); sppo
    (epsilon 0.3); rec (epsilon_low/high 0.2, epsilon_low_prime 0.6, epsilon_high_prime 2.0, clip_mode
    none|one-side|gspo-one-side|two-side|ring, weight none|importance_sampling|gspo_importance_sampling|
    advantage, temp 1.0, regularizer none|k2|forward-kl, regularizer_coef 0.0); importance_sampling
    (loss_agg_mode); sapo (tau_pos 1.0, tau_neg 1.05, loss_agg_mode); m2po (m2_threshold 0.04,
    log_ratio_clip 20.0, loss_agg_mode token-mean only)."""
    kl_penalty_fn: str | None = None
    """KL applied as a reward penalty: none, k1, k2, k3, low_var_kl, abs, corrected_k3 (= k3 here)."""
    kl_penalty_fn_args: dict[str, Any] | None = None
    """Arguments of the KL penalty (kl_coef, adaptive, target_kl, horizon). kl_coef 0 means no
    penalty: no reference model is loaded and no kl metric reported."""
    kl_loss_fn: str | None = None
    """KL added to the loss: none, k1, k2, k3, low_var_kl, abs, corrected_k3 (k3 times the importance
    ratio to the behaviour policy, clamped to [0, 2])."""
    kl_loss_fn_args: dict[str, Any] | None = None
    """Arguments of the KL loss (kl_coef). kl_coef 0 means no KL loss: no reference model is loaded
    and no kl_loss metric reported."""
    entropy_loss_fn: str | None = None
    """default or none."""
    entropy_loss_fn_args: dict[str, Any] | None = None
    """Arguments of the entropy loss (entropy_coef)."""
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = "token-mean"
    """How per-token losses are reduced to a scalar."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """Actor optimizer."""
    use_critic: bool | None = None
    """Train a value model (PPO with GAE); None lets the preset decide (true for ppo only)."""
    value_loss_fn_args: dict[str, Any] | None = None
    """Critic loss when use_critic: cliprange_value (0.5, veRL's default) and value_loss_coef (1.0)."""
    bypass_old_logprobs: bool = True
    """Trinity v0.6's switch of the behaviour policy. true (Trinity's default): old_logprob is the
    rollout engine's logprobs as recorded with each experience, and the trainer runs no extra forward
    (two policies: rollout, current); rows that arrived without logprobs (external agents) are still
    recomputed. false: before each update the trainer recomputes old_logprob of every row with the
    weights it holds (three policies: rollout, old, current), and rollout_correction, when set,
    corrects for the gap between old and rollout. Unset: rollout_correction.bypass_mode if given."""
    rollout_correction: RolloutCorrectionConfig | None = None
    """Off-policy correction between the engine's and the trainer's logprobs (Trinity v0.6, veRL's
    schema): importance weights and rejection sampling, metrics `rollout_corr/*` each step. null: none."""

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: Any) -> Any:
        default_type = cls.model_fields["algorithm_type"].default
        return _fill_bypass(apply_preset(data, default_type)) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _off_policy_settings_agree(self) -> AlgorithmConfig:
        correction = self.rollout_correction
        if correction is not None:
            if correction.bypass_mode is not None and correction.bypass_mode != self.bypass_old_logprobs:
                raise ValueError(
                    f"algorithm.rollout_correction.bypass_mode ({correction.bypass_mode}) and "
                    f"algorithm.bypass_old_logprobs ({self.bypass_old_logprobs}) are one setting; give one"
                )
            if correction.loss_type == "reinforce" and not self.bypass_old_logprobs:
                raise ValueError(
                    "algorithm.rollout_correction.loss_type reinforce applies in bypass mode only "
                    "(bypass_old_logprobs true); with recomputed old logprobs use ppo_clip"
                )
        if self.algorithm_type == "m2po" and self.policy_loss_fn != "m2po":
            raise ValueError(
                f"algorithm_type m2po requires policy_loss_fn 'm2po', got {self.policy_loss_fn!r}"
            )
        if self.policy_loss_fn == "m2po" and not self.bypass_old_logprobs:
            raise ValueError(
                "policy_loss_fn m2po requires algorithm.bypass_old_logprobs true, so the importance "
                "ratio is measured against the rollout (behaviour) policy (Trinity's check)"
            )
        return self

    def part(self, key: str) -> str:
        """The name of part `key` (advantage_fn, policy_loss_fn, kl_penalty_fn, kl_loss_fn,
        entropy_loss_fn, sample_strategy): always set once validated, by the user or the preset."""
        value = getattr(self, key)
        if not isinstance(value, str):
            raise ValueError(f"algorithm.{key} is not resolved (build the config by validation)")
        return value

    @property
    def recompute_old_logprob(self) -> bool:
        """The trainer recomputes old_logprob for every row before the update (bypass off)."""
        return not self.bypass_old_logprobs

    @field_validator("algorithm_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in algorithm_types():
            raise ValueError(f"unknown algorithm_type {value!r}; allowed: {', '.join(algorithm_types())}")
        return value


def _fill_bypass(raw: dict[str, Any]) -> dict[str, Any]:
    """bypass_old_logprobs left unset takes rollout_correction.bypass_mode (veRL's spelling) when that
    is given, so both agree in every process; a disagreement of two given values is refused later."""
    correction = raw.get("rollout_correction")
    if isinstance(correction, dict):
        mode = correction.get("bypass_mode")
    else:  # None, or an already-built RolloutCorrectionConfig
        mode = getattr(correction, "bypass_mode", None)
    if raw.get("bypass_old_logprobs") is None and mode is not None:
        return {**raw, "bypass_old_logprobs": mode}
    return raw
