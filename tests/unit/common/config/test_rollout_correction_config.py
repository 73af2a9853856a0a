"""`algorithm.bypass_old_logprobs` and `algorithm.rollout_correction` (Trinity v0.6, veRL's schema):
defaults, threshold parsing, the one bypass switch under its three spellings, M2PO's rules, and
Trinity's two M2PO example configs through `trinity config check`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.cli.config_check import check_file
from services.common.config import validate_config
from services.common.config.rollout_correction import Bounds, parse_is_threshold, parse_rs_thresholds
from services.common.errors import ConfigError
from tests.conftest import REPO

M2PO_EXAMPLES = REPO / "tests" / "data" / "trinity-v0.6-examples" / "m2po_gsm8k"


def algorithm(**section: Any) -> Any:
    return validate_config({"algorithm": section}).algorithm


def test_defaults_are_trinitys() -> None:
    cfg = algorithm(algorithm_type="grpo")
    assert cfg.bypass_old_logprobs is True and cfg.recompute_old_logprob is False
    assert cfg.rollout_correction is None
    section = algorithm(algorithm_type="grpo", rollout_correction={}).rollout_correction
    # veRL's RolloutCorrectionConfig defaults: sequence-level IS truncated at 2, no rejection, ppo_clip
    assert (section.rollout_is, section.rollout_is_threshold, section.rollout_rs) == ("sequence", 2.0, None)
    assert section.loss_type == "ppo_clip" and section.rollout_is_batch_normalize is False
    assert section.is_bounds == Bounds(None, 2.0) and section.rs_bounds == {}


def test_is_threshold_number_truncates_and_lower_upper_masks() -> None:
    assert parse_is_threshold(2.0) == Bounds(None, 2.0)
    assert parse_is_threshold("3") == Bounds(None, 3.0)
    assert parse_is_threshold("0.5_5.0") == Bounds(0.5, 5.0)
    for bad, message in [("5_0.5", "lower bound 5.0 is above"), ("two", "not a number"), (-1.0, "positive")]:
        with pytest.raises(ValueError, match=message):
            parse_is_threshold(bad)


def test_rs_thresholds_one_for_all_or_one_per_option() -> None:
    # one number for a k1 option is the ratio band [1/u, u]
    assert parse_rs_thresholds("token_k1", 2.0) == {"token_k1": Bounds(0.5, 2.0)}
    assert parse_rs_thresholds("token_k1, seq_mean_k3", "0.9_1.2,0.01") == {
        "token_k1": Bounds(0.9, 1.2),
        "seq_mean_k3": Bounds(None, 0.01),
    }
    # duplicates collapse; one value is shared by every option
    assert parse_rs_thresholds("seq_max_k2,seq_max_k2,token_k3", 0.5) == {
        "seq_max_k2": Bounds(None, 0.5),
        "token_k3": Bounds(None, 0.5),
    }


@pytest.mark.parametrize(
    ("rollout_rs", "threshold", "message"),
    [
        ("token_k4", 1.0, "unknown option.*allowed .*seq_max_k3"),
        ("seq_max_k1", 1.0, "unknown option"),  # veRL has no max of k1
        ("token_k1", None, "give rollout_rs_threshold"),
        ("token_k2,token_k3", "0.1,0.2,0.3", "3 values for 2 rollout_rs options"),
        ("token_k3", "0.1_0.2", "bounds a divergence from above"),
    ],
)
def test_bad_rejection_settings_fail_at_load(rollout_rs: str, threshold: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        algorithm(rollout_correction={"rollout_rs": rollout_rs, "rollout_rs_threshold": threshold})


def test_one_bypass_switch_under_three_spellings() -> None:
    # veRL's spelling fills Trinity v0.6's key when that is unset ...
    assert algorithm(rollout_correction={"bypass_mode": False}).bypass_old_logprobs is False
    assert algorithm(bypass_old_logprobs=False).recompute_old_logprob is True
    # ... both given must agree
    assert algorithm(
        bypass_old_logprobs=False, rollout_correction={"bypass_mode": False}
    ).recompute_old_logprob
    with pytest.raises(
        ConfigError, match="bypass_mode \\(True\\) and algorithm.bypass_old_logprobs \\(False\\)"
    ):
        algorithm(bypass_old_logprobs=False, rollout_correction={"bypass_mode": True})
    # Trinity v0.5.2 read it from the inline veRL config
    verl = {"trainer_config": {"algorithm": {"rollout_correction": {"bypass_mode": False}}}}
    assert validate_config({"trainer": verl}).algorithm.bypass_old_logprobs is False
    with pytest.raises(ConfigError, match="are one setting"):
        validate_config({"trainer": verl, "algorithm": {"bypass_old_logprobs": True}})


def test_the_resolved_config_loads_again_the_same() -> None:
    # every process reads the dumped config: the filled key and veRL's spelling must still agree
    cfg = validate_config(
        {"algorithm": {"algorithm_type": "grpo", "rollout_correction": {"bypass_mode": False}}}
    )
    again = validate_config(cfg.model_dump(mode="json", exclude={"stages"}))
    assert again.algorithm == cfg.algorithm and again.algorithm.bypass_old_logprobs is False


def test_reinforce_is_a_bypass_mode_loss() -> None:
    with pytest.raises(ConfigError, match="loss_type reinforce applies in bypass mode only"):
        algorithm(bypass_old_logprobs=False, rollout_correction={"loss_type": "reinforce"})
    with pytest.raises(ConfigError, match="loss_type"):
        algorithm(rollout_correction={"loss_type": "vanilla"})


def test_m2po_preset_and_rules() -> None:
    cfg = algorithm(algorithm_type="m2po")
    # Trinity v0.6's M2POAlgorithm.default_config
    assert cfg.repeat_times == 8 and cfg.advantage_fn == "grpo" and cfg.policy_loss_fn == "m2po"
    assert (cfg.kl_penalty_fn, cfg.kl_loss_fn, cfg.entropy_loss_fn) == ("none", "none", "none")
    assert cfg.sample_strategy == "default" and cfg.bypass_old_logprobs is True
    with pytest.raises(ConfigError, match="requires algorithm.bypass_old_logprobs true"):
        algorithm(algorithm_type="m2po", bypass_old_logprobs=False)
    with pytest.raises(ConfigError, match="requires algorithm.bypass_old_logprobs true"):
        algorithm(algorithm_type="grpo", policy_loss_fn="m2po", rollout_correction={"bypass_mode": False})
    with pytest.raises(ConfigError, match="algorithm_type m2po requires policy_loss_fn 'm2po'"):
        algorithm(algorithm_type="m2po", policy_loss_fn="ppo")


@pytest.mark.parametrize("name", ["explorer.yaml", "trainer.yaml"])
def test_trinitys_m2po_examples_pass_config_check_but_for_data(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("TRINITY_CHECKPOINT_ROOT_DIR", "TRINITY_MODEL_PATH", "TRINITY_TASKSET_PATH"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    cfg, report = check_file(str(M2PO_EXAMPLES / name), [])
    assert cfg is not None and cfg.algorithm.policy_loss_fn == "m2po"
    assert cfg.algorithm.policy_loss_fn_args == {"m2_threshold": 0.04, "log_ratio_clip": 20.0}
    assert all("does not exist" in p for p in report.problems), report.problems
