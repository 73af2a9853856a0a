"""Every built-in part, listed in one place, by Trinity-RFT's names.

A user part is named by dotted path "pkg.module:fn" in the same config key, with the same call
signature as the built-ins of its kind:
    advantage_fn:     fn(batch: TrainBatch, **args) -> AdvantageOutput
    policy_loss_fn:   fn(batch: TrainBatch, logprob: Tensor, **args) -> (loss, metrics)
    kl_*_fn:          fn(logprob: Tensor, ref_logprob: Tensor) -> kl [B, T]
    entropy_loss_fn:  fn(batch: TrainBatch, entropy: Tensor | None, **args) -> (term, metrics)
    sample_strategy:  class(**args) with .plan(*, train_batch_size, model_version, step=None)
"""

from __future__ import annotations

from services.trainer.algorithms import entropy, kl, sample_strategy
from services.trainer.algorithms.advantage import gae, grpo, opmd, reinforce_pp, rloo
from services.trainer.algorithms.policy_loss import cispo, dpo, gspo, mix, ppo, sft
from services.trainer.algorithms.policy_loss import opmd as opmd_loss
from services.trainer.algorithms.registry import Registry

ADVANTAGE_FN = Registry(
    "algorithm.advantage_fn",
    {
        "grpo": grpo.grpo,
        "ppo": gae.ppo,
        "rloo": rloo.rloo,
        "reinforceplusplus": reinforce_pp.reinforceplusplus,
        "opmd": opmd.opmd,
        "none": gae.none,
    },
)

POLICY_LOSS_FN = Registry(
    "algorithm.policy_loss_fn",
    {
        "ppo": ppo.ppo,
        "gspo": gspo.gspo,
        "cispo": cispo.cispo,
        "opmd": opmd_loss.opmd,
        "sft": sft.sft,
        "dpo": dpo.dpo,
        "mix": mix.mix,
    },
)

_KL = {
    "none": kl.kl_none,
    "k1": kl.kl_k1,
    "k2": kl.kl_k2,
    "k3": kl.kl_k3,
    "low_var_kl": kl.kl_low_var,
    "abs": kl.kl_abs,
}
KL_PENALTY_FN = Registry("algorithm.kl_penalty_fn", _KL)
KL_LOSS_FN = Registry("algorithm.kl_loss_fn", _KL)

ENTROPY_LOSS_FN = Registry(
    "algorithm.entropy_loss_fn",
    {"default": entropy.default, "mix": entropy.mix, "none": entropy.none},
)

SAMPLE_STRATEGY = Registry(
    "algorithm.sample_strategy",
    {
        "default": sample_strategy.DefaultSampleStrategy,
        "staleness_control": sample_strategy.StalenessControlSampleStrategy,
        "mix": sample_strategy.MixSampleStrategy,
    },
)
