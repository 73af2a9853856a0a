"""wait_healthy's early exits: a child that died stops the wait with an error, one that exited
cleanly (its work done before a poll saw it serving) ends it quietly. No server listens on the
address, as for a process that is gone."""

from __future__ import annotations

import socket

import pytest

from services.common.health import wait_healthy


def closed_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


async def test_a_process_that_died_ends_the_wait_with_an_error() -> None:
    with pytest.raises(RuntimeError, match="exited before it became healthy"):
        await wait_healthy(closed_address(), 30.0, alive=lambda: False, finished=lambda: False)
    with pytest.raises(RuntimeError, match="exited before it became healthy"):
        await wait_healthy(closed_address(), 30.0, alive=lambda: False)


async def test_a_process_that_finished_cleanly_ends_the_wait() -> None:
    await wait_healthy(closed_address(), 30.0, alive=lambda: False, finished=lambda: True)


async def test_a_live_process_that_never_serves_times_out() -> None:
    with pytest.raises(TimeoutError, match="not SERVING"):
        await wait_healthy(closed_address(), 0.3, alive=lambda: True, finished=lambda: True)
