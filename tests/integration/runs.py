"""`trinity run` as a user runs it, for the integration tests that drive whole runs: write the config,
run the CLI in a subprocess, read summary.json."""

from __future__ import annotations

import json
import pathlib
import subprocess
from typing import Any

import yaml

from tests.conftest import TRINITY

PORTS = {svc: {"port": 0} for svc in ("buffer", "synchronizer", "trainer", "explorer")}
"""Every service on a free port (the runner picks them), so runs can share the machine."""


def write_run_config(cfg: dict[str, Any], path: pathlib.Path) -> pathlib.Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def trinity_run(config: pathlib.Path, *overrides: str, timeout: float = 540) -> str:
    """`trinity run --config CONFIG --set O...` in the config's folder; asserts exit 0, returns the output."""
    args = [str(TRINITY), "run", "--config", str(config), *(a for o in overrides for a in ("--set", o))]
    done = subprocess.run(args, cwd=config.parent, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def stages(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    """summary.json's stage entries, in order."""
    return list(json.loads((run_dir / "summary.json").read_text())["stages"])
