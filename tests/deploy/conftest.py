"""`make test-deploy`: a Docker engine (started here when none runs, stopped by its pid at the end) and
the trinity-grpc image built offline (scripts/build_image.py: local base image, host wheelhouse)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from scripts.docker_host import daemon_answers
from tests.deploy.stack import REPO

IMAGE = "trinity-grpc:cpu"


def _script(name: str, *args: str, timeout: float = 1800) -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], timeout=timeout)
    assert done.returncode == 0, f"scripts/{name} {' '.join(args)} exited {done.returncode}"
    print(f"scripts/{name} {' '.join(args)}: {time.monotonic() - started:.0f} s")


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[None]:
    """Engine + compose v2 installed if missing; a daemon started unless one answers (then left alone)."""
    _script("docker_host.py", "install")
    already_running = daemon_answers()
    _script("docker_host.py", "start")
    try:
        yield
    finally:
        if not already_running:
            _script("docker_host.py", "stop")


@pytest.fixture(scope="session")
def image(docker_engine: None) -> str:
    """trinity-grpc:cpu, built offline (rebuilt only when its sources' content hash changed)."""
    _script("build_image.py", "--offline", "--tag", IMAGE)
    return IMAGE
