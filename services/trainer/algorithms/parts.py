"""Every built-in trainer-side part, listed in one place by Trinity-RFT's names (advantage fns, which
the explorer runs too, are listed in services/algorithms/advantage/__init__.py).

Built-ins are "pkg.module:attr" paths imported on first use. A user part is named by dotted path
"pkg.module:fn" in the same config key, with the same call signature as the built-ins of its kind:
    policy_loss_fn:   fn(batch: TrainBatch, logprob: Tensor, **args) -> (loss, metrics)
    kl_*_fn:          fn(logprob: Tensor, ref_logprob: Tensor) -> kl [B, T]
    entropy_loss_fn:  fn(batch: TrainBatch, entropy: Tensor | None, **args) -> (term, metrics)
    sample_strategy:  class(**args) with .plan(*, train_batch_size, model_version, step=None)
"""

from __future__ import annotations

from services.common.registry import Registry

POLICY_LOSS_FN = Registry(
    "policy_loss_fn",
    {
        "ppo": "services.trainer.algorithms.policy_loss.ppo:ppo",
        "gspo": "services.trainer.algorithms.policy_loss.gspo:gspo",
        "cispo": "services.trainer.algorithms.policy_loss.cispo:cispo",
        "opmd": "services.trainer.algorithms.policy_loss.opmd:opmd",
        "sft": "services.trainer.algorithms.policy_loss.sft:sft",
        "dpo": "services.trainer.algorithms.policy_loss.dpo:dpo",
        "mix": "services.trainer.algorithms.policy_loss.mix:mix",
        "mix_chord": "services.trainer.algorithms.policy_loss.chord:mix_chord",
        "sft_is": "services.trainer.algorithms.policy_loss.chord:sft_is",
        "sft_phi": "services.trainer.algorithms.policy_loss.chord:sft_phi",
        "topr": "services.trainer.algorithms.policy_loss.reinforce_family:topr",
        "sppo": "services.trainer.algorithms.policy_loss.reinforce_family:sppo",
        "rec": "services.trainer.algorithms.policy_loss.rec:rec",
        "importance_sampling": "services.trainer.algorithms.policy_loss.reinforce_family:importance_sampling",
        "sapo": "services.trainer.algorithms.policy_loss.sapo:sapo",
        "m2po": "services.trainer.algorithms.policy_loss.m2po:m2po",
    },
    config_key="algorithm.policy_loss_fn",
)

_KL = {
    "none": "services.trainer.algorithms.kl:kl_none",
    "k1": "services.trainer.algorithms.kl:kl_k1",
    "k2": "services.trainer.algorithms.kl:kl_k2",
    "k3": "services.trainer.algorithms.kl:kl_k3",
    "low_var_kl": "services.trainer.algorithms.kl:kl_low_var",
    "abs": "services.trainer.algorithms.kl:kl_abs",
    "corrected_k3": "services.trainer.algorithms.kl:kl_corrected_k3",
}
KL_PENALTY_FN = Registry("kl_penalty_fn", _KL, config_key="algorithm.kl_penalty_fn")
KL_LOSS_FN = Registry("kl_loss_fn", _KL, config_key="algorithm.kl_loss_fn")

ENTROPY_LOSS_FN = Registry(
    "entropy_loss_fn",
    {
        "default": "services.trainer.algorithms.entropy:default",
        "mix": "services.trainer.algorithms.entropy:mix",
        "none": "services.trainer.algorithms.entropy:none",
    },
    config_key="algorithm.entropy_loss_fn",
)

SAMPLE_STRATEGY = Registry(
    "sample_strategy",
    {
        "default": "services.trainer.algorithms.sample_strategy:DefaultSampleStrategy",
        "warmup": "services.trainer.algorithms.sample_strategy:DefaultSampleStrategy",
        "staleness_control": "services.trainer.algorithms.sample_strategy:StalenessControlSampleStrategy",
        "mix": "services.trainer.algorithms.sample_strategy:MixSampleStrategy",
    },
    config_key="algorithm.sample_strategy",
)
