"""A service process whose stop cannot finish (a worker thread that asyncio.run must wait for, as a
`generate` call or a checkpoint write would be) still exits within services.shutdown_grace_s plus
HARD_STOP_MARGIN_S, saying so in its log; one with nothing left running exits at once, silently.

A real process: a ServiceServer on a loopback port with the watchdog enabled as a service entry
enables it, a real thread blocked in the default executor, SIGTERM from the test.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from services.common.hard_stop import HARD_STOP_MARGIN_S
from services.common.procs import free_port, wait_healthy

GRACE_S = 0.5
SCRIPT = """
import asyncio, sys, time
from services.common import hard_stop
from services.common.config.services import ServicesConfig
from services.common.logging import configure_logging
from services.common.server import ServiceServer

async def main(block_s):
    services = ServicesConfig.model_validate({"buffer": {"port": int(sys.argv[1])}, "shutdown_grace_s": float(sys.argv[3])})
    server = ServiceServer("buffer", services)
    await server.start()
    if block_s:
        asyncio.get_running_loop().run_in_executor(None, time.sleep, block_s)
    await server.wait()

configure_logging("buffer", "info")
hard_stop.enable()
asyncio.run(main(float(sys.argv[2])))
"""


async def stop_time(block_s: float) -> tuple[float, int, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(port), str(block_s), str(GRACE_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        await wait_healthy(f"127.0.0.1:{port}", 60)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        return time.monotonic() - sent, code, proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_a_stop_blocked_by_a_thread_ends_within_grace_plus_margin() -> None:
    took, code, out = await stop_time(block_s=30)
    assert code == 0, out
    assert "stop_overran_grace" in out, out
    assert took < GRACE_S + HARD_STOP_MARGIN_S + 0.7, f"{took:.2f} s"
    assert took >= GRACE_S + HARD_STOP_MARGIN_S - 0.1, f"{took:.2f} s: cut before the grace was over"


@pytest.mark.parametrize("block_s", [0.0])
async def test_a_stop_with_nothing_running_is_not_cut(block_s: float) -> None:
    took, code, out = await stop_time(block_s)
    assert code == 0 and "stop_overran_grace" not in out, out
    assert took < GRACE_S + 0.7, f"{took:.2f} s"
