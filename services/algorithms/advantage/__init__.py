"""Advantage functions, fn(batch: TrainBatch, **args) -> AdvantageOutput, and their registry.

Built-ins are named by Trinity-RFT's names and imported on first use; a user fn is named by dotted
path "pkg.module:fn" in `algorithm.advantage_fn`.
"""

from __future__ import annotations

from services.common.registry import Registry

ADVANTAGE_FN = Registry(
    "advantage_fn",
    {
        "grpo": "services.algorithms.advantage.grpo:grpo",
        "ppo": "services.algorithms.advantage.gae:ppo",
        "rloo": "services.algorithms.advantage.rloo:rloo",
        "reinforceplusplus": "services.algorithms.advantage.reinforce_pp:reinforceplusplus",
        "opmd": "services.algorithms.advantage.opmd:opmd",
        "none": "services.algorithms.advantage.gae:none",
        # Trinity keeps a veRL-backend copy of some estimators under *_verl; same numbers here.
        "grpo_verl": "services.algorithms.advantage.grpo:grpo",
        "opmd_verl": "services.algorithms.advantage.opmd:opmd",
        "asymre": "services.algorithms.advantage.group_variants:asymre",
        "asymre_verl": "services.algorithms.advantage.group_variants:asymre",
        "reinforce": "services.algorithms.advantage.group_variants:reinforce",
        "rec": "services.algorithms.advantage.group_variants:rec",
        # Registered so Trinity configs load; each fails at the first batch naming the missing data.
        "remax": "services.algorithms.advantage.external_signal:remax",
        "on_policy_distill": "services.algorithms.advantage.external_signal:on_policy_distill",
        "jsd": "services.algorithms.advantage.external_signal:jsd",
        "step_wise_grpo": "services.algorithms.advantage.external_signal:step_wise_grpo",
        # computed by the explorer's pipeline; trainer rows without advantages are refused
        "gigpo": "services.algorithms.advantage.gigpo:gigpo",
        "cod": "services.algorithms.advantage.cod:cod",
        "clipb": "services.algorithms.advantage.external_signal:clipb",
        "clipv": "services.algorithms.advantage.external_signal:clipv",
    },
    config_key="algorithm.advantage_fn",
)
