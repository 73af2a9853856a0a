"""Which trainers publish versions: mode both always; mode train beside a serve-mode proxy."""

from __future__ import annotations

import pytest

from services.common.config import validate_config
from services.trainer.server import publishes


@pytest.mark.parametrize(
    ("mode", "sync", "expected"),
    [
        ("both", {}, True),
        ("train", {}, False),  # nccl, fixed: nobody loads what a lone train run would publish
        ("train", {"sync_method": "checkpoint"}, False),  # the demo's SFT stage: fixed style
        ("train", {"sync_method": "checkpoint", "sync_style": "dynamic_by_trainer"}, True),  # serve + train
        ("train", {"sync_method": "checkpoint", "sync_style": "fully_async"}, True),
        ("train", {"sync_method": "nccl", "sync_style": "dynamic_by_trainer"}, False),
        ("explore", {"sync_method": "checkpoint", "sync_style": "dynamic_by_trainer"}, False),
    ],
)
def test_a_train_run_publishes_only_under_a_plan_a_serve_proxy_follows(
    mode: str, sync: dict, expected: bool
) -> None:
    assert publishes(validate_config({"mode": mode, "synchronizer": sync})) is expected
