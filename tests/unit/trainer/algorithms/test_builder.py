"""Presets, the registry (built-ins, dotted paths, errors), and every type building and backpropagating
(the losses by hand: test_builder_losses.py)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from services.algorithms.advantage.base import AdvantageOutput
from services.common.config.algorithm import AlgorithmConfig
from services.common.errors import InvalidArgument
from services.trainer.algorithms import build_algorithm
from services.trainer.algorithms.policy_loss.adapter import batch_loss
from tests.conftest import REPO
from tests.fakes.tensors import close, make_batch, t

ALL_TYPES = [
    "ppo",
    "grpo",
    "opmd",
    "dpo",
    "sft",
    "mix",
    "rloo",
    "reinforceplusplus",
    "gspo",
    "cispo",
    "mix_chord",
    "grpo_verl",
    "topr",
    "sapo",
    "asymre",
    "sppo",
    "rec",
    "raft",
    "dapo",
]
# Types whose advantage fn needs data our rows lack: they build, then fail at the first batch.
NEEDS_MISSING_DATA = {
    "multi_step_grpo": "run id and step index",
    "on_policy_distill": "teacher_logprobs",
    "jsd": "teacher_logprobs",
}


def user_advantage(batch, *, scale: float = 1.0) -> AdvantageOutput:
    """A user part loaded by dotted path: advantage = scale * reward on every token."""
    adv = scale * batch.rewards.unsqueeze(-1) * batch.action_mask
    return AdvantageOutput(adv, adv, {"user/called": 1.0})


def anchored_tensor_loss(logprob, ref_logprob, action_mask):
    """A user policy loss (dotted path) that reads the reference logprobs: squared drift from them."""
    return ((logprob - ref_logprob) ** 2 * action_mask).sum(), {}


anchored_loss = batch_loss(anchored_tensor_loss, name="anchored")


# ---- presets -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("algo", "advantage", "policy", "kl_loss", "entropy", "strategy", "repeat"),
    [
        ("ppo", "ppo", "ppo", "k2", "default", "default", 1),
        ("grpo", "grpo", "ppo", "k2", "default", "default", 2),
        ("opmd", "opmd", "opmd", "k2", "default", "default", 2),
        ("rloo", "rloo", "ppo", "k2", "default", "default", 2),
        ("reinforceplusplus", "reinforceplusplus", "ppo", "k2", "default", "default", 2),
        ("gspo", "grpo", "gspo", "k2", "default", "default", 2),
        ("cispo", "grpo", "cispo", "k2", "default", "default", 2),
        ("mix", "grpo", "mix", "k2", "mix", "mix", 8),
        ("sft", "none", "sft", "none", "none", "default", 1),
        ("dpo", "none", "dpo", "k2", "default", "default", 2),
        # Trinity v0.5.2's AlgorithmType.default_config of the types added in issue 20
        ("mix_chord", "grpo", "mix_chord", "k2", "mix", "mix", 8),
        ("grpo_verl", "grpo_verl", "ppo", "k2", "default", "default", 2),
        ("multi_step_grpo", "step_wise_grpo", "ppo", "k2", "default", "default", 8),
        ("topr", "reinforce", "topr", "k2", "default", "default", 2),
        ("sapo", "grpo", "sapo", "k2", "default", "default", 2),
        ("asymre", "asymre", "opmd", "none", "none", "default", 2),
        ("sppo", "opmd", "sppo", "none", "none", "default", 2),
        ("rec", "rec", "rec", "k2", "default", "default", 2),
        ("on_policy_distill", "on_policy_distill", "ppo", "none", "none", "default", 8),
        ("jsd", "jsd", "ppo", "none", "none", "default", 8),
        ("raft", "none", "sft", "none", "none", "default", 1),
        # Trinity v0.6's M2POAlgorithm.default_config
        ("m2po", "grpo", "m2po", "none", "none", "default", 8),
        # Trinity v0.6's DAPOAlgorithm (no KL, so no reference model)
        ("dapo", "grpo", "ppo", "none", "default", "default", 16),
    ],
)
def test_preset_fills_parts_like_trinity(algo, advantage, policy, kl_loss, entropy, strategy, repeat):
    cfg = AlgorithmConfig(algorithm_type=algo)  # the preset is applied when the section is validated
    assert (cfg.advantage_fn, cfg.policy_loss_fn, cfg.kl_loss_fn) == (advantage, policy, kl_loss)
    assert (cfg.entropy_loss_fn, cfg.sample_strategy, cfg.repeat_times) == (entropy, strategy, repeat)
    assert cfg.kl_penalty_fn == "none"


def test_dapo_needs_no_reference_model():
    assert not build_algorithm(
        AlgorithmConfig(algorithm_type="dapo")
    ).use_reference  # Trinity: use_reference False
    assert build_algorithm(AlgorithmConfig(algorithm_type="grpo")).use_reference


def test_preset_never_overrides_user_settings():
    cfg = AlgorithmConfig(
        algorithm_type="grpo", repeat_times=8, policy_loss_fn="gspo", kl_loss_fn="none", use_critic=False
    )
    assert (cfg.repeat_times, cfg.policy_loss_fn, cfg.kl_loss_fn, cfg.advantage_fn) == (
        8,
        "gspo",
        "none",
        "grpo",
    )


def test_flags_follow_the_parts():
    ppo = build_algorithm(AlgorithmConfig(algorithm_type="ppo"))
    assert ppo.use_critic and ppo.use_reference and ppo.needs_old_logprob
    sft = build_algorithm(AlgorithmConfig(algorithm_type="sft"))
    assert not sft.use_critic and not sft.use_reference and not sft.needs_old_logprob
    dpo = build_algorithm(AlgorithmConfig(algorithm_type="dpo", kl_loss_fn="none"))
    assert dpo.use_reference and not dpo.needs_old_logprob  # DPO needs the reference for its loss itself
    grpo_no_kl = build_algorithm(AlgorithmConfig(algorithm_type="grpo", kl_loss_fn="none"))
    assert not grpo_no_kl.use_reference  # no KL anywhere -> no reference forward pass
    assert build_algorithm(AlgorithmConfig(algorithm_type="grpo")).sample_strategy.name == "default"


def test_a_kl_term_with_coefficient_zero_needs_no_reference_model():
    # Trinity's rec_gsm8k and mix_chord examples set kl_coef 0.0 beside a KL loss: 0 * kl adds nothing.
    zero_loss = AlgorithmConfig(algorithm_type="grpo", kl_loss_fn="k2", kl_loss_fn_args={"kl_coef": 0.0})
    algo = build_algorithm(zero_loss)
    assert not algo.use_reference and algo.zero_advantage_is_inert
    zero_penalty = AlgorithmConfig(
        algorithm_type="reinforceplusplus",
        kl_loss_fn="none",
        kl_penalty_fn="k1",
        kl_penalty_fn_args={"kl_coef": 0.0, "adaptive": True, "target_kl": 0.1, "horizon": 100},
    )
    assert not build_algorithm(zero_penalty).use_reference  # adaptive from 0 stays 0
    penalty = AlgorithmConfig(algorithm_type="reinforceplusplus", kl_loss_fn="none", kl_penalty_fn="k1")
    assert build_algorithm(penalty).use_reference  # the default kl_coef 0.001


def test_a_policy_loss_reading_ref_logprob_gets_a_reference_model():
    cfg = AlgorithmConfig(
        algorithm_type="sft", policy_loss_fn="tests.unit.trainer.algorithms.test_builder:anchored_loss"
    )
    assert build_algorithm(cfg).use_reference
    assert not build_algorithm(AlgorithmConfig(algorithm_type="sft")).use_reference


# ---- registry errors -----------------------------------------------------------------------------


def test_unknown_names_list_allowed_values():
    with pytest.raises(ValidationError, match="unknown algorithm_type 'ppo2'; allowed: .*grpo"):
        AlgorithmConfig(algorithm_type="ppo2")  # refused when the config is loaded, by every service
    for key, allowed in [
        ("advantage_fn", "reinforceplusplus"),
        ("policy_loss_fn", "cispo"),
        ("kl_loss_fn", "low_var_kl"),
        ("kl_penalty_fn", "k3"),
        ("entropy_loss_fn", "default"),
        ("sample_strategy", "staleness_control"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            build_algorithm(AlgorithmConfig(algorithm_type="grpo", **{key: "nope"}))
        assert err.value.field == f"algorithm.{key}" and allowed in err.value.message


def test_unknown_arguments_are_rejected_not_ignored():
    with pytest.raises(InvalidArgument) as err:
        build_algorithm(AlgorithmConfig(algorithm_type="grpo", policy_loss_fn_args={"clip_rnage": 0.3}))
    assert err.value.field == "algorithm.policy_loss_fn_args" and "clip_range" in err.value.message
    with pytest.raises(InvalidArgument) as err:
        build_algorithm(AlgorithmConfig(algorithm_type="grpo", kl_loss_fn_args={"coef": 0.1}))
    assert err.value.field == "algorithm.kl_loss_fn_args"
    with pytest.raises(InvalidArgument):
        build_algorithm(
            AlgorithmConfig(
                algorithm_type="grpo", loss_agg_mode="token-mean", policy_loss_fn_args={"loss_agg_mode": "x"}
            )
        )
    with pytest.raises(InvalidArgument) as err:
        build_algorithm(AlgorithmConfig(algorithm_type="ppo", use_critic=False))
    assert err.value.field == "algorithm.use_critic"


def test_user_part_by_dotted_path():
    algo = build_algorithm(
        AlgorithmConfig(
            algorithm_type="grpo",
            advantage_fn="tests.unit.trainer.algorithms.test_builder:user_advantage",
            advantage_fn_args={"scale": 2.0},
        )
    )
    batch = make_batch(2, 2, rewards=t(1.0, -1.0))
    metrics = algo.compute_advantages(batch)
    assert metrics["user/called"] == 1.0 and close(batch.advantages, t([2.0, 2.0], [-2.0, -2.0]))
    with pytest.raises(InvalidArgument) as err:
        build_algorithm(AlgorithmConfig(algorithm_type="grpo", advantage_fn="no.such.module:fn"))
    assert err.value.field == "algorithm.advantage_fn"


@pytest.mark.parametrize("algo", ALL_TYPES)
def test_every_preset_builds_and_backpropagates(algo):
    a = build_algorithm(AlgorithmConfig(algorithm_type=algo))
    batch = make_batch(
        4,
        3,
        rewards=t(1.0, 0.0, 0.5, 0.2),
        group_index=torch.tensor([0, 0, 1, 1]),
        old_logprob=torch.full((4, 3), -1.0),
        ref_logprob=torch.full((4, 3), -1.1),
        values=torch.zeros(4, 3),
        is_expert=torch.tensor([False, False, True, True]),
        pair_index=torch.tensor([0, 0, 1, 1]),
    )
    a.compute_advantages(batch)
    logprob = torch.full((4, 3), -0.9, requires_grad=True)
    values = torch.zeros(4, 3, requires_grad=True) if a.use_critic else None
    loss, metrics = a.compute_loss(batch, logprob, torch.ones(4, 3), values)
    loss.backward()
    assert torch.isfinite(loss) and logprob.grad is not None and metrics


@pytest.mark.parametrize(("algo", "missing"), sorted(NEEDS_MISSING_DATA.items()))
def test_types_needing_missing_data_build_then_name_what_is_missing(algo, missing):
    a = build_algorithm(AlgorithmConfig(algorithm_type=algo))
    batch = make_batch(2, 2, rewards=t(1.0, 0.0))
    with pytest.raises(InvalidArgument, match=missing) as err:
        a.compute_advantages(batch)
    assert err.value.field == "algorithm.advantage_fn"


def test_no_grpc_in_the_algorithm_packages():
    services = REPO / "services"
    offenders = [
        p.name
        for root in (services / "trainer" / "algorithms", services / "algorithms")
        for p in root.rglob("*.py")
        if "import grpc" in p.read_text() or "from grpc" in p.read_text()
    ]
    assert offenders == []


def test_corrected_k3_loss_gets_the_behaviour_logprobs():
    # equal rewards -> GRPO advantages 0 -> pg_loss 0; the loss is kl_coef * corrected_k3 alone:
    # logprob 0, ref ln 0.5 -> k3 = 0.5 - 1 + ln 2 = 0.193147; old ln 0.5 -> ratio 2 -> 0.386294
    cfg = AlgorithmConfig(algorithm_type="grpo", kl_loss_fn="corrected_k3", kl_loss_fn_args={"kl_coef": 1.0})
    a = build_algorithm(cfg)
    half = torch.full((2, 1), math.log(0.5))
    batch = make_batch(2, 1, rewards=t(1.0, 1.0), old_logprob=half, ref_logprob=half)
    a.compute_advantages(batch)
    loss, m = a.compute_loss(batch, torch.zeros(2, 1), None)
    assert loss.item() == pytest.approx(0.386294, abs=1e-5) and m["kl_loss"] == pytest.approx(
        0.386294, abs=1e-5
    )


def test_warmup_is_trinitys_name_for_the_default_sample_strategy():
    a = build_algorithm(AlgorithmConfig(algorithm_type="grpo", sample_strategy="warmup"))
    assert [
        (r.source, r.batch_size) for r in a.sample_strategy.plan(train_batch_size=4, model_version=0)
    ] == [("experience", 4)]


def test_types_needing_missing_data_train_on_producer_given_advantages():
    # on_policy_distill's advantage step is skipped when the rows carry advantages (e.g. a workflow
    # that scored the teacher itself); PPO on A = 1 at ratio 1 gives loss -1
    a = build_algorithm(AlgorithmConfig(algorithm_type="on_policy_distill"))
    batch = make_batch(2, 1, advantages=torch.ones(2, 1))
    a.compute_advantages(batch)
    loss, _ = a.compute_loss(batch, torch.zeros(2, 1), None)
    assert loss.item() == pytest.approx(-1.0)
