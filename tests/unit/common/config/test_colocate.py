"""mode colocate's config: what it can run with, refused naming the key otherwise; in place sync."""

from __future__ import annotations

import pytest

from services.common.config import validate_config
from services.common.errors import ConfigError

COLOCATE = {"mode": "colocate"}


def test_colocate_defaults_sync_in_place_through_the_checkpoint_plan() -> None:
    cfg = validate_config({**COLOCATE, "synchronizer": {"sync_method": "memory"}})
    assert cfg.synchronizer.in_place and cfg.synchronizer.method == "checkpoint"
    both = validate_config({"synchronizer": {"sync_method": "memory"}})
    assert not both.synchronizer.in_place and both.synchronizer.method == "nccl"


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"explorer": {"rollout_model": {"engine_num": 2}}}, "engine_num"),
        ({"explorer": {"replicas": 2}}, "explorer.replicas"),
        ({"explorer": {"rollout_model": {"tensor_parallel_size": 2}}}, "tensor_parallel_size"),
        ({"trainer": {"strategy": "fsdp2"}}, "trainer.strategy"),
        ({"synchronizer": {"sync_interval": 2}}, "sync_interval"),
        ({"synchronizer": {"sync_offset": 1}}, "sync_offset"),
        ({"synchronizer": {"sync_style": "fully_async"}}, "sync_style"),
    ],
)
def test_what_colocate_cannot_run_with_is_refused_by_name(extra: dict, key: str) -> None:
    with pytest.raises(ConfigError, match="mode colocate") as err:
        validate_config({**COLOCATE, **extra})
    assert key in str(err.value)


@pytest.mark.parametrize("engine_type", ["transformers", "vllm", "vllm_async"])
def test_colocate_runs_with_either_engine(engine_type: str) -> None:
    cfg = validate_config({**COLOCATE, "explorer": {"rollout_model": {"engine_type": engine_type}}})
    assert cfg.mode == "colocate" and cfg.synchronizer.in_place


def test_lora_is_refused_in_colocate() -> None:
    lora = {"model": {"lora_configs": [{"name": "a", "lora_rank": 4, "lora_alpha": 8}]}}
    with pytest.raises(ConfigError, match="lora_configs"):
        validate_config({**COLOCATE, **lora})
