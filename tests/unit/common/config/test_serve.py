"""mode serve's keys: Trinity's serve keys under explorer, the proxy's limits, the plan serve needs."""

from __future__ import annotations

import pytest

from services.common.config import validate_config
from services.common.errors import ConfigError

SERVE = {"mode": "serve", "synchronizer": {"sync_method": "checkpoint", "sync_style": "dynamic_by_trainer"}}


def test_trinity_s_serve_keys_are_read_with_their_defaults() -> None:
    ex = validate_config(SERVE).explorer
    assert (ex.proxy_port, ex.service_status_check_interval, ex.min_running_model_num, ex.db_url) == (
        8010,
        60,
        1,
        None,
    )
    assert ex.listen_address == "127.0.0.1"  # loopback unless asked (Trinity: 0.0.0.0)
    assert ex.serve.max_concurrent_requests == 64 and ex.serve.session_ttl_s == 1800


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"synchronizer": {"sync_method": "nccl", "sync_style": "dynamic_by_trainer"}},
            "sync_method: checkpoint",
        ),
        ({"synchronizer": {"sync_method": "checkpoint"}}, "dynamic_by_trainer"),  # fixed: nothing to hold
        (
            {
                "synchronizer": {
                    "sync_method": "checkpoint",
                    "sync_style": "dynamic_by_trainer",
                    "max_staleness": 2,
                }
            },
            "max_staleness",
        ),
        ({"explorer": {"db_url": "postgresql://x/y"}}, "only sqlite URLs"),
        ({"explorer": {"min_running_model_num": 2}}, "more than explorer.rollout_model.engine_num 1"),
        ({"explorer": {"serve": {"max_concurrent_requests": 0}}}, "max_concurrent_requests"),
    ],
)
def test_what_serve_mode_refuses_names_the_key(extra: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config({**SERVE, **extra})


def test_the_serve_keys_change_nothing_in_other_modes() -> None:
    cfg = validate_config({"mode": "both", "explorer": {"proxy_port": 9000, "listen_address": "0.0.0.0"}})
    assert cfg.mode == "both" and cfg.explorer.proxy_port == 9000  # accepted; only mode serve listens there
