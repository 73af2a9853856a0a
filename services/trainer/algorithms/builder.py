"""Compose an Algorithm from an AlgorithmConfig: preset -> parts from the registries -> one object.

The composite owns the only state an algorithm has (the adaptive KL coefficient and, for MIX, the
row counts of the current batch); every part stays a pure function.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from services.algorithms.advantage import ADVANTAGE_FN
from services.algorithms.batch import TrainBatch
from services.algorithms.masked import check_loss_agg_mode
from services.common.config.algorithm import AlgorithmConfig
from services.common.errors import InvalidArgument
from services.common.registry import check_args
from services.trainer.algorithms import parts
from services.trainer.algorithms.api import Algorithm, LossMetrics
from services.trainer.algorithms.kl import KLTerm
from services.trainer.algorithms.rollout_correction import RolloutCorrection, reinforce_is_loss
from services.trainer.algorithms.value_loss import clipped_value_loss

_KL_ARGS = {"kl_coef", "adaptive", "target_kl", "horizon"}
_VALUE_ARGS = {"cliprange_value", "value_loss_coef"}
_NO_OLD_LOGPROB = ("sft", "dpo", "sft_is", "sft_phi")  # losses that never read the behaviour logprobs
_MIX_LOSSES = ("mix", "mix_chord")
# losses whose every token term is the advantage times something: a zero advantage adds nothing
_ADVANTAGE_SCALED = (
    "ppo",
    "gspo",
    "cispo",
)  # losses weighting usual vs expert rows by the whole batch's counts
# losses whose per-token term is linear in the advantage, with any clipping decided by its sign: for
# them w_t * loss_t(A_t) = loss_t(w_t * A_t) (w >= 0), so the rollout IS weights scale the advantages
_IS_WEIGHTED = ("ppo", "gspo", "cispo", "sapo", "importance_sampling")


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _kl_term(registry: Any, name: str, args: dict[str, Any] | None, key: str) -> KLTerm:
    args = dict(args or {})
    unknown = sorted(set(args) - _KL_ARGS)
    if unknown:
        raise InvalidArgument(
            f"unknown argument(s) {unknown}; allowed: {sorted(_KL_ARGS)}", field=f"{key}_args"
        )
    return KLTerm(name=name, estimator=registry.get(name), config_key=f"{key}_args", **args)


def last_token_scores(rewards: Tensor, action_mask: Tensor) -> Tensor:
    """rewards [B] placed on the last action token of each row -> [B, T] (Trinity's token_level_scores)."""
    scores = torch.zeros_like(action_mask, dtype=torch.float32)
    positions = torch.arange(action_mask.shape[-1], device=action_mask.device).expand_as(action_mask)
    last = (
        torch.where(action_mask > 0, positions, torch.full_like(positions, -1))
        .max(dim=-1)
        .values.clamp(min=0)
    )
    scores[torch.arange(action_mask.shape[0]), last] = rewards.to(torch.float32)
    return scores


class CompositeAlgorithm(Algorithm):
    """Advantage fn + policy loss + KL penalty/loss + entropy term (+ critic loss) + sample strategy."""

    def __init__(self, cfg: AlgorithmConfig) -> None:
        self.config = cfg
        self.name = cfg.algorithm_type
        self.loss_agg_mode = check_loss_agg_mode(cfg.loss_agg_mode, "algorithm.loss_agg_mode")
        agg_is_explicit = "loss_agg_mode" in cfg.model_fields_set
        self.advantage_fn = ADVANTAGE_FN.get(cfg.part("advantage_fn"))
        self.advantage_args = dict(cfg.advantage_fn_args or {})
        check_args(self.advantage_fn, self.advantage_args, "algorithm.advantage_fn_args", skip=1)
        self.policy_loss_fn = parts.POLICY_LOSS_FN.get(cfg.part("policy_loss_fn"))
        self.policy_args = dict(cfg.policy_loss_fn_args or {})
        check_args(self.policy_loss_fn, self.policy_args, "algorithm.policy_loss_fn_args", skip=2)
        # An explicit algorithm.loss_agg_mode applies to the policy loss too; otherwise the loss keeps
        # its own default (token-mean, GSPO seq-mean-token-mean).
        if (
            agg_is_explicit
            and "loss_agg_mode" not in self.policy_args
            and _accepts(self.policy_loss_fn, "loss_agg_mode")
        ):
            self.policy_args["loss_agg_mode"] = self.loss_agg_mode
        if "loss_agg_mode" in self.policy_args:
            check_loss_agg_mode(
                self.policy_args["loss_agg_mode"], "algorithm.policy_loss_fn_args.loss_agg_mode"
            )
        self.kl_penalty = _kl_term(
            parts.KL_PENALTY_FN, cfg.part("kl_penalty_fn"), cfg.kl_penalty_fn_args, "algorithm.kl_penalty_fn"
        )
        self.kl_loss = _kl_term(
            parts.KL_LOSS_FN, cfg.part("kl_loss_fn"), cfg.kl_loss_fn_args, "algorithm.kl_loss_fn"
        )
        self.entropy_fn = parts.ENTROPY_LOSS_FN.get(cfg.part("entropy_loss_fn"))
        self.entropy_args = dict(cfg.entropy_loss_fn_args or {})
        check_args(self.entropy_fn, self.entropy_args, "algorithm.entropy_loss_fn_args", skip=2)
        if _accepts(self.entropy_fn, "loss_agg_mode"):
            self.entropy_args.setdefault("loss_agg_mode", self.loss_agg_mode)
        # With no entropy term in the loss, entropy is only a metric: the engine computes it without grad.
        self.entropy_needs_grad = (
            cfg.entropy_loss_fn != "none" and float(self.entropy_args.get("entropy_coef", 0.0)) != 0.0
        )
        strategy_cls = parts.SAMPLE_STRATEGY.get(cfg.part("sample_strategy"))
        strategy_args = dict(cfg.sample_strategy_args or {})
        check_args(strategy_cls, strategy_args, "algorithm.sample_strategy_args")
        self.sample_strategy = strategy_cls(**strategy_args)
        self.value_args = {"cliprange_value": 0.5, "value_loss_coef": 1.0, **(cfg.value_loss_fn_args or {})}
        unknown = sorted(set(self.value_args) - _VALUE_ARGS)
        if unknown:
            raise InvalidArgument(
                f"unknown argument(s) {unknown}; allowed: {sorted(_VALUE_ARGS)}",
                field="algorithm.value_loss_fn_args",
            )
        self.use_critic = bool(cfg.use_critic)
        if cfg.advantage_fn == "ppo" and not self.use_critic:
            raise InvalidArgument(
                "advantage_fn 'ppo' (GAE) needs a critic; set algorithm.use_critic true",
                field="algorithm.use_critic",
            )
        # the reference model is loaded only for a KL term with a nonzero coefficient, or a loss
        # reading ref_logprob itself (DPO)
        loss_reads_ref = "ref_logprob" in getattr(self.policy_loss_fn, "batch_tensors", ())
        self.use_reference = self.kl_penalty.active or self.kl_loss.active or loss_reads_ref
        self.needs_old_logprob = cfg.policy_loss_fn not in _NO_OLD_LOGPROB
        # the engine fills batch.entropy (current model, before the update) for these advantage fns
        self.needs_entropy = cfg.advantage_fn in ("clipb",)
        self.zero_advantage_is_inert = (
            cfg.policy_loss_fn in _ADVANTAGE_SCALED
            and not self.kl_loss.active
            and not self.entropy_needs_grad
            and not self.use_critic
        )
        self._mix_counts: tuple[int, int] | None = None
        self._setup_off_policy(cfg)
        self.policy_agg_mode = self._policy_agg_mode()

    def _setup_off_policy(self, cfg: AlgorithmConfig) -> None:
        """bypass_old_logprobs, rollout_correction and the policy loss's own hooks (M2PO's prepass)."""
        check = getattr(self.policy_loss_fn, "check", None)
        if check is not None:
            check(self.policy_args)
        self.needs_update_prepass = hasattr(self.policy_loss_fn, "prepass")
        self.recompute_old_logprob = cfg.recompute_old_logprob and self.needs_old_logprob
        self.bypass = cfg.bypass_old_logprobs
        rc = cfg.rollout_correction
        self.correction = RolloutCorrection.from_config(rc) if rc is not None else None
        self.reinforce = rc is not None and self.bypass and rc.loss_type == "reinforce"
        if rc is None:
            return
        name = cfg.policy_loss_fn
        if not self.needs_old_logprob:
            raise InvalidArgument(
                f"policy_loss_fn {name} reads no behaviour logprobs: there is nothing to correct; "
                "remove algorithm.rollout_correction",
                field="algorithm.rollout_correction",
            )
        if not self.bypass and rc.rollout_is is not None and name not in _IS_WEIGHTED:
            raise InvalidArgument(
                f"rollout_is weights each token's policy loss, done here by scaling its advantage: exact "
                f"for {', '.join(_IS_WEIGHTED)}, not for policy_loss_fn {name}; set rollout_is null "
                "(rollout_rs still applies) or bypass_old_logprobs true",
                field="algorithm.rollout_correction.rollout_is",
            )
        if self.reinforce and name != "ppo":
            raise InvalidArgument(
                f"loss_type reinforce replaces the ppo policy loss (veRL's bypass mode), not {name}; "
                "use loss_type ppo_clip",
                field="algorithm.rollout_correction.loss_type",
            )

    # ---- per batch -------------------------------------------------------------------------------
    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """KL reward penalty, then the advantage fn (over non-expert rows); rows it drops get mask 0."""
        metrics: dict[str, float] = {}
        scores = batch.token_level_rewards
        if scores is None:
            scores = last_token_scores(batch.rewards, batch.action_mask)
        scores, kl_metrics = self.kl_penalty.apply_penalty(
            scores, batch.old_logprob, batch.ref_logprob, batch.action_mask
        )
        metrics |= kl_metrics
        batch.token_level_rewards = scores
        expert = (
            batch.is_expert.bool()
            if batch.is_expert is not None
            else torch.zeros(len(batch), dtype=torch.bool)
        )
        self._mix_counts = (int((~expert).sum().item()), int(expert.sum().item()))
        if batch.advantages is not None:  # given by the producer (e.g. computed explorer-side)
            if batch.returns is None:
                batch.returns = batch.advantages.clone()
            return metrics
        advantages = torch.zeros_like(batch.action_mask, dtype=torch.float32)
        returns = torch.zeros_like(advantages)
        usual = (~expert).nonzero(as_tuple=True)[0]
        if usual.numel():
            out = self.advantage_fn(batch.select(usual), **self.advantage_args)
            advantages[usual] = out.advantages.to(advantages.dtype)
            returns[usual] = out.returns.to(returns.dtype)
            metrics |= out.metrics
            if out.keep is not None:
                dropped = usual[~out.keep.bool()]
                batch.action_mask = batch.action_mask.clone()
                batch.action_mask[dropped] = 0
        batch.advantages, batch.returns = advantages, returns
        return metrics

    def correct_batch(self, batch: TrainBatch) -> dict[str, float]:
        """Recomputed old logprobs vs the engine's, once per batch (veRL's decoupled mode): rejected
        tokens leave action_mask, IS weights scale the advantages (see _IS_WEIGHTED)."""
        if self.correction is None or self.bypass or batch.rollout_logprob is None:
            return {}
        weights, keep, metrics = self.correction(batch.old_logprob, batch.rollout_logprob, batch.action_mask)
        batch.action_mask = batch.action_mask * keep
        if weights is not None:
            batch.advantages = batch.require("advantages") * weights
        return metrics

    def before_update(self, batch: TrainBatch, logprob: Tensor) -> dict[str, float]:
        if not self.needs_update_prepass:
            return {}
        return dict(self.policy_loss_fn.prepass(batch, logprob, self.policy_args))

    # ---- per micro-batch -------------------------------------------------------------------------
    def compute_loss(
        self,
        batch: TrainBatch,
        logprob: Tensor,
        entropy: Tensor | None,
        values: Tensor | None = None,
        *,
        loss_scale: float = 1.0,
        token_scale: float | None = None,
    ) -> tuple[Tensor, LossMetrics]:
        if self.needs_old_logprob and batch.advantages is None:
            raise InvalidArgument(
                "call compute_advantages(batch) before compute_loss", field="batch.advantages"
            )
        if batch.advantages is None:  # SFT / DPO: the losses ignore them, the adapters still read them
            batch.advantages = torch.zeros_like(logprob)
        args = dict(self.policy_args)
        if self.config.policy_loss_fn in _MIX_LOSSES:
            args |= self._mix_weights(batch, loss_scale)
        loss, metrics, corr_metrics = self._policy_loss(batch, logprob, args)
        kl_term, kl_metrics = self.kl_loss.loss(
            logprob,
            batch.ref_logprob,
            batch.action_mask,
            self.loss_agg_mode,
            old_logprob=batch.old_logprob if self.needs_old_logprob else None,
        )
        ent_term, ent_metrics = self.entropy_fn(batch, entropy, **self.entropy_args)

        def scaled(term: Tensor, mode: str | None) -> Tensor:
            # a token-mean term of this micro-batch times its share of the batch's tokens is its part
            # of the batch's token-mean; every other mode's share is the rows'
            return term * (token_scale if token_scale is not None and mode == "token-mean" else loss_scale)

        total = (
            scaled(loss, self.policy_agg_mode)
            + scaled(kl_term, self.loss_agg_mode)
            - scaled(ent_term, self.entropy_args.get("loss_agg_mode"))
        )
        out: dict[str, float | Tensor] = {**metrics, **kl_metrics, **ent_metrics, **corr_metrics}
        if self.use_critic:
            if values is None or batch.values is None or batch.returns is None:
                raise InvalidArgument(
                    "use_critic: pass current values and set batch.values / batch.returns", field="values"
                )
            vf_loss, vf_metrics = clipped_value_loss(
                values,
                batch.returns,
                batch.values,
                batch.action_mask,
                cliprange_value=self.value_args["cliprange_value"],
                loss_agg_mode=self.loss_agg_mode,
            )
            total = total + scaled(self.value_args["value_loss_coef"] * vf_loss, self.loss_agg_mode)
            out |= vf_metrics
        return total, out

    def _policy_agg_mode(self) -> str | None:
        """How the policy loss aggregates (None: its own weights, as mix's, are by rows)."""
        if self.config.policy_loss_fn in _MIX_LOSSES:
            return None
        if self.reinforce:
            return str(self.policy_args.get("loss_agg_mode", self.loss_agg_mode))
        if "loss_agg_mode" in self.policy_args:
            return str(self.policy_args["loss_agg_mode"])
        if not _accepts(self.policy_loss_fn, "loss_agg_mode"):
            return None
        return str(inspect.signature(self.policy_loss_fn).parameters["loss_agg_mode"].default)

    def _policy_loss(
        self, batch: TrainBatch, logprob: Tensor, args: dict[str, Any]
    ) -> tuple[Tensor, LossMetrics, dict[str, float]]:
        """The policy loss; in bypass mode with rollout_correction, veRL's per-micro-batch correction
        against the current policy first (rejection narrows the policy loss's mask; IS weights are
        metrics for ppo_clip, the REINFORCE weights for reinforce)."""
        if self.correction is None or not self.bypass:
            return (*self.policy_loss_fn(batch, logprob, **args), {})
        weights, keep, corr_metrics = self.correction(logprob.detach(), batch.old_logprob, batch.action_mask)
        batch = replace(batch, action_mask=batch.action_mask * keep)
        if self.reinforce:
            agg = args.get("loss_agg_mode", self.loss_agg_mode)
            advantages = batch.require("advantages")
            return (
                *reinforce_is_loss(logprob, batch.old_logprob, batch.action_mask, advantages, weights, agg),
                corr_metrics,
            )
        return (*self.policy_loss_fn(batch, logprob, **args), corr_metrics)

    def _mix_weights(self, batch: TrainBatch, loss_scale: float) -> dict[str, float]:
        """usual_weight = (n_usual_mb / N_usual) / loss_scale, so after * loss_scale each side is a mean over its rows."""
        if self._mix_counts is None or loss_scale <= 0 or batch.is_expert is None:
            return {}
        n_usual, n_expert = self._mix_counts
        expert = batch.is_expert.bool()
        mb_expert = int(expert.sum().item())
        mb_usual = len(batch) - mb_expert
        return {
            "usual_weight": (mb_usual / n_usual) / loss_scale if n_usual else 0.0,
            "expert_weight": (mb_expert / n_expert) / loss_scale if n_expert else 0.0,
        }


def build_algorithm(cfg: AlgorithmConfig) -> Algorithm:
    """AlgorithmConfig -> Algorithm; every part is already named (the preset is applied at load)."""
    return CompositeAlgorithm(cfg)
