"""Presets, the registry (built-ins, dotted paths, errors) and the composed Algorithm end to end."""

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


# ---- the composite, end to end ------------------------------------------------------------------


def _grpo_batch() -> tuple:
    # one group, rewards [1, 0]: mean 0.5, std sqrt(0.5) = 0.707107 -> A = +-0.5 / (0.707107 + 1e-6) = +-0.707106
    batch = make_batch(2, 2, rewards=t(1.0, 0.0), ref_logprob=torch.zeros(2, 2))
    logprob = t([0.1, 0.1], [0.0, 0.0]).requires_grad_(True)
    return batch, logprob


def test_grpo_total_loss_by_hand():
    # pg: row 0 ratio e^0.1 = 1.105171 (inside clip), A = +0.707106 -> -0.781473 per token
    #     row 1 ratio 1, A = -0.707106 -> +0.707106 per token; token-mean over 4 = -0.037183
    # kl loss k2: d = [0.1, 0.1, 0, 0] -> d^2/2 = 0.005, 0.005, 0, 0 -> mean 0.0025 * 0.001 = 0.0000025
    # entropy: coef 0.1 * mean(1) = 0.1, subtracted. total = -0.037183 + 0.0000025 - 0.1 = -0.137181
    algo = build_algorithm(AlgorithmConfig(algorithm_type="grpo", entropy_loss_fn_args={"entropy_coef": 0.1}))
    batch, logprob = _grpo_batch()
    algo.compute_advantages(batch)
    assert close(batch.advantages, t([0.707106, 0.707106], [-0.707106, -0.707106]))
    loss, m = algo.compute_loss(batch, logprob, torch.ones(2, 2))
    assert loss.item() == pytest.approx(-0.137181, abs=1e-5)
    assert m["pg_loss"] == pytest.approx(-0.037183, abs=1e-5)
    assert m["kl_loss"] == pytest.approx(0.0025) and m["kl_coef"] == 0.001
    assert m["entropy_loss"] == pytest.approx(1.0)
    assert {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"} <= set(m)
    # loss_scale multiplies the loss, not the metrics
    half, m_half = algo.compute_loss(batch, logprob, torch.ones(2, 2), loss_scale=0.5)
    assert half.item() == pytest.approx(loss.item() / 2) and m_half["pg_loss"] == m["pg_loss"]


def test_micro_batches_with_loss_scale_sum_to_the_full_batch_loss():
    # token-mean with equal row lengths: loss(full) = sum over micro-batches of loss(mb) * rows(mb) / rows
    algo = build_algorithm(AlgorithmConfig(algorithm_type="grpo"))
    torch.manual_seed(0)
    batch = make_batch(
        4,
        3,
        rewards=t(1.0, 0.0, 0.5, 2.0),
        group_index=torch.tensor([0, 0, 1, 1]),
        old_logprob=-torch.rand(4, 3),
        ref_logprob=-torch.rand(4, 3),
    )
    algo.compute_advantages(batch)
    logprob = -torch.rand(4, 3)
    full, _ = algo.compute_loss(batch, logprob, None)
    parts = [
        algo.compute_loss(batch.select(idx), logprob[idx], None, loss_scale=len(idx) / 4)[0]
        for idx in (torch.tensor([0, 2, 3]), torch.tensor([1]))
    ]
    assert sum(p.item() for p in parts) == pytest.approx(full.item(), abs=1e-6)


def test_mix_weights_keep_each_side_a_mean_over_its_rows_across_micro_batches():
    # 2 usual rows + 2 expert rows. Full batch: 0.9 * PPO(usual) + 0.1 * SFT(expert), each a mean over
    # its own rows. Split into micro-batches {usual, usual, expert} and {expert}: the weights
    # n_side_in_mb / n_side_in_batch / loss_scale make the sum equal the full-batch loss.
    algo = build_algorithm(AlgorithmConfig(algorithm_type="mix", kl_loss_fn="none"))
    batch = make_batch(
        4,
        2,
        rewards=t(1.0, 0.0, 0.0, 0.0),
        group_index=torch.tensor([0, 0, 1, 1]),
        old_logprob=torch.full((4, 2), -1.0),
        is_expert=torch.tensor([False, False, True, True]),
    )
    algo.compute_advantages(batch)
    assert close(batch.advantages[2:], torch.zeros(2, 2))  # expert rows get no advantage
    logprob = t([-0.9, -0.9], [-1.0, -1.0], [-2.0, -2.0], [-4.0, -4.0])
    full, m = algo.compute_loss(batch, logprob, None)
    # usual: A = +-0.707106; row 0 ratio e^0.1 -> -0.781473, row 1 ratio 1 -> +0.707106: pg = -0.037183
    # expert: sequence means 2 and 4 -> sft 3. total = 0.9 * -0.037183 + 0.1 * 3 = 0.266535
    assert full.item() == pytest.approx(0.266535, abs=1e-5)
    assert m["expert/sft_loss"] == pytest.approx(3.0)
    idx_a, idx_b = torch.tensor([0, 1, 2]), torch.tensor([3])
    part_a, _ = algo.compute_loss(batch.select(idx_a), logprob[idx_a], None, loss_scale=3 / 4)
    part_b, _ = algo.compute_loss(batch.select(idx_b), logprob[idx_b], None, loss_scale=1 / 4)
    assert part_a.item() + part_b.item() == pytest.approx(full.item(), abs=1e-5)


def test_std_threshold_masks_dropped_rows():
    algo = build_algorithm(AlgorithmConfig(algorithm_type="grpo", advantage_fn_args={"std_threshold": 0.0}))
    batch = make_batch(4, 2, rewards=t(1.0, 0.0, 0.5, 0.5), group_index=torch.tensor([0, 0, 1, 1]))
    metrics = algo.compute_advantages(batch)
    assert metrics["filtered_count"] == 2.0
    assert close(batch.action_mask, t([1, 1], [1, 1], [0, 0], [0, 0]))


def test_kl_penalty_shapes_rewards_before_the_advantage():
    # reinforce++ with k1 penalty coef 0.5: one row, reward 1 on the last token, old - ref = [0.2, 0.2]
    # token rewards = [0 - 0.1, 1 - 0.1] = [-0.1, 0.9]; returns (gamma 1) = [0.8, 0.9]
    algo = build_algorithm(
        AlgorithmConfig(
            algorithm_type="reinforceplusplus", kl_penalty_fn="k1", kl_penalty_fn_args={"kl_coef": 0.5}
        )
    )
    batch = make_batch(
        1, 2, rewards=t(1.0), old_logprob=torch.full((1, 2), -1.0), ref_logprob=torch.full((1, 2), -1.2)
    )
    metrics = algo.compute_advantages(batch)
    assert close(batch.token_level_rewards, t([-0.1, 0.9]))
    assert close(batch.returns, t([0.8, 0.9]))
    assert metrics["kl"] == pytest.approx(0.2) and metrics["kl_coef"] == 0.5


def test_reward_lands_on_the_last_action_token():
    algo = build_algorithm(AlgorithmConfig(algorithm_type="reinforceplusplus", kl_loss_fn="none"))
    batch = make_batch(2, 3, rewards=t(1.0, 2.0), action_mask=t([1, 1, 0], [1, 1, 1]))
    algo.compute_advantages(batch)
    assert close(batch.token_level_rewards, t([0.0, 1.0, 0.0], [0.0, 0.0, 2.0]))


def test_ppo_with_critic_adds_value_loss():
    algo = build_algorithm(AlgorithmConfig(algorithm_type="ppo", kl_loss_fn="none"))
    batch = make_batch(1, 2, rewards=t(1.0), values=t([0.5, 0.2]))
    algo.compute_advantages(batch)
    # GAE (gamma = lam = 1): returns [1, 1] (see test_advantages); advantages whitened [-0.707107, 0.707107]
    assert close(batch.returns, t([1.0, 1.0]))
    vpreds = t([1.0, 0.0]).requires_grad_(True)
    loss, m = algo.compute_loss(batch, torch.zeros(1, 2), None, vpreds)
    # ratio 1: pg = mean(-0.707107 * -1, -0.707107) = 0. value loss, old values [0.5, 0.2], clip 0.5:
    # tok 1: vpred 1, clamp(1, 0, 1) = 1, return 1 -> 0; tok 2: vpred 0, clamp(0, -0.3, 0.7) = 0, return 1 -> 1
    # 0.5 * mean(0, 1) = 0.25
    assert m["vf_loss"] == pytest.approx(0.25)
    assert loss.item() == pytest.approx(0.25, abs=1e-6)


def test_sft_and_dpo_run_without_advantages():
    sft = build_algorithm(AlgorithmConfig(algorithm_type="sft"))
    batch = make_batch(1, 2)
    sft.compute_advantages(batch)
    loss, m = sft.compute_loss(batch, t([-1.0, -3.0]), None)
    assert loss.item() == pytest.approx(2.0) and m == {"sft_loss": pytest.approx(2.0)}
    dpo = build_algorithm(AlgorithmConfig(algorithm_type="dpo", kl_loss_fn="none"))
    batch = make_batch(2, 2, ref_logprob=torch.full((2, 2), -1.5), pair_index=torch.tensor([0, 0]))
    loss, m = dpo.compute_loss(batch, t([-1.0, -1.0], [-2.0, -2.0]), None)
    assert loss.item() == pytest.approx(0.598139, abs=1e-5)  # see test_policy_losses


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
