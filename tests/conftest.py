"""Shared fixtures: repo paths, free ports, temp configs, service processes stopped by PID, a throw-away CA."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
import yaml

from services.common.procs import free_port, start_service, stop_process

REPO = pathlib.Path(__file__).resolve().parent.parent
BUF = REPO / "tools" / "node" / "node_modules" / ".bin" / "buf"
TRINITY = pathlib.Path(sys.executable).parent / "trinity"


@pytest.fixture
def repo() -> pathlib.Path:
    return REPO


def write_config(path: pathlib.Path, data: dict) -> pathlib.Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def make_config(tmp_path: pathlib.Path):
    """Write a config with free ports for all four services under tmp_path; returns (path, dict)."""

    def make(extra: dict | None = None, name: str = "config.yaml") -> tuple[pathlib.Path, dict]:
        data: dict = {
            "checkpoint_root_dir": str(tmp_path / "runs"),
            "services": {
                svc: {"port": free_port()} for svc in ("buffer", "synchronizer", "trainer", "explorer")
            },
        }
        data["services"]["shutdown_grace_s"] = 3
        for key, value in (extra or {}).items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return write_config(tmp_path / name, data), data

    return make


@pytest.fixture
def service_process(tmp_path: pathlib.Path) -> Iterator:
    """Start `python -m services.<name>` children; all are stopped (SIGTERM, then SIGKILL) at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, config: pathlib.Path, **kwargs) -> subprocess.Popen[bytes]:
        log_path = kwargs.pop("log_path", str(tmp_path / f"{name}-{len(procs)}.log"))
        proc = start_service(name, str(config), log_path=log_path, **kwargs)
        proc.log_path = log_path  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        stop_process(proc, timeout=10)


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def certs(tmp_path: pathlib.Path) -> pathlib.Path:
    """A throw-away CA, a server certificate for localhost/127.0.0.1 and a client certificate."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        cwd=tmp_path,
    )
    (tmp_path / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=tmp_path,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            f"{name}.pem",
            cwd=tmp_path,
        )
    return tmp_path


__all__ = ["BUF", "REPO", "TRINITY", "free_port", "write_config"]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
