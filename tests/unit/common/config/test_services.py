"""`services.<name>.metrics_port`: off by default, bound where the gRPC server binds, never the gRPC port."""

from __future__ import annotations

import pytest

from services.common.config import load_config
from services.common.config.services import SERVICE_NAMES, Endpoint
from services.common.errors import ConfigError


def test_metrics_are_off_by_default_for_every_service() -> None:
    cfg = load_config(None)
    assert [cfg.services.endpoint(name).metrics_port for name in SERVICE_NAMES] == [None] * 4


def test_metrics_bind_the_interface_of_the_grpc_server() -> None:
    assert Endpoint(host="10.0.0.5", port=50051, metrics_port=9451).bind_host == "10.0.0.5"
    assert Endpoint(host="buffer", bind="0.0.0.0", metrics_port=9451).bind_host == "0.0.0.0"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["services.trainer.port=50053", "services.trainer.metrics_port=50053"], "gRPC `port` too"),
        (["services.trainer.metrics_port=-1"], "greater than or equal to 0"),
        (["services.trainer.metrics_port=70000"], "less than or equal to 65535"),
    ],
)
def test_a_bad_metrics_port_is_refused_naming_the_key(overrides: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.field == "services.trainer.metrics_port" and fragment in str(info.value)


def test_metrics_port_zero_is_allowed_beside_grpc_port_zero() -> None:
    cfg = load_config(None, ["services.trainer.port=0", "services.trainer.metrics_port=0"])
    assert (cfg.services.trainer.port, cfg.services.trainer.metrics_port) == (0, 0)
