"""Binding rules of the view server: loopback without a token, anything else only with one."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.view.server import check_binding, is_loopback


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
    ],
)
def test_is_loopback(host, loopback) -> None:
    assert is_loopback(host) is loopback


def test_a_wider_binding_needs_a_token() -> None:
    with pytest.raises(InvalidArgument, match="--host 0.0.0.0 serves the run beyond this machine") as err:
        check_binding("0.0.0.0", None)
    assert err.value.field == "host"
    check_binding("0.0.0.0", "t")
    check_binding("127.0.0.1", None)
