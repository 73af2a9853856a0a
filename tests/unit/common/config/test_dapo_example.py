"""Trinity v0.6's DAPO example (tests/data/trinity-v0.6-examples/dapo_math/dapo.yaml), unchanged,
through `trinity config check`: every key understood; what stops it is only the data sets it names
(Hugging Face hub ids these machines do not have)."""

from __future__ import annotations

import pytest

from services.cli.config_check import check_file
from tests.conftest import REPO

DAPO = REPO / "tests" / "data" / "trinity-v0.6-examples" / "dapo_math" / "dapo.yaml"


def test_trinitys_dapo_example_fails_only_on_its_data_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRINITY_MODEL_PATH", "builtin:tiny-arith")
    cfg, report = check_file(str(DAPO), [])
    assert [p for p in report.problems if "does not exist" not in p] == []
    assert sum("does not exist" in p for p in report.problems) == 2  # the taskset and AIME2024
    assert cfg is not None
    algorithm = cfg.algorithm
    assert (algorithm.algorithm_type, algorithm.repeat_times, algorithm.advantage_fn) == ("dapo", 16, "grpo")
    assert (algorithm.policy_loss_fn, algorithm.kl_loss_fn, algorithm.kl_penalty_fn) == (
        "ppo",
        "none",
        "none",
    )
    assert algorithm.policy_loss_fn_args == {
        "clip_range_low": 0.2,
        "clip_range_high": 0.28,
        "clip_ratio_c": 1.0e6,
        "loss_agg_mode": "token-mean",
    }
    assert cfg.data_processor.experience_pipeline is not None
    names = [op.name for op in cfg.data_processor.experience_pipeline.operators]
    assert names == ["mask_response_truncated", "dapo_dynamic_sampling"]
    assert cfg.explorer.max_num_gen_batches == 10  # refill on, veRL's DAPO recipe's cap
    assert cfg.train_batch_size == 32 * 16  # the trainer reads the 32 groups of 16 of an explorer step
