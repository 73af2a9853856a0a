"""Ulysses sequence parallelism on 2 CPU ranks (gloo, FSDP2, ulysses size 2) equals one process.

tests/integration/ulysses_cases.py runs one training step of each case under torchrun, every
sequence split over both ranks (attention through the all-to-all), and the same step here in one
process without any split. The loss parts, the pre-clip gradient norm and every parameter's
accumulated gradient must agree (to float noise), and so must the weights after the AdamW step.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import torch

from services.common.procs import free_port, stop_process
from tests.integration.ulysses_cases import CASES, run

LOSS_PARTS = (
    "actor/loss",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/vf_loss",
    "actor/grad_norm",
)
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _torchrun_cases(out: pathlib.Path, log_path: pathlib.Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "tests.integration.ulysses_cases",
        str(out),
    ]
    path = os.pathsep.join([str(ROOT), str(ROOT / "gen"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        rc = proc.wait(240)
    finally:
        stop_process(proc, timeout=10)
    assert rc == 0, log_path.read_text()[-4000:]
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ulysses")
    return _torchrun_cases(tmp / "cases.pt", tmp / "torchrun.log")


@pytest.mark.slow  # one torchrun of two ranks, three engines each: ~30 s on an idle 2-core machine
@pytest.mark.parametrize("case", CASES)
def test_ulysses_on_two_ranks_equals_one_process(sharded: dict[str, Any], case: str) -> None:
    got, expected = sharded[case], run(case)
    assert got["attention"] == "ulysses_sdpa" and expected["attention"] == "sdpa"
    assert got["groups"] == (2, 0, 1)  # size 2, rank 0 of its group, one data-parallel group
    for key in LOSS_PARTS:
        if key in expected["metrics"]:
            assert got["metrics"][key] == pytest.approx(expected["metrics"][key], rel=1e-5, abs=1e-7), key
    assert got["grads"].keys() == expected["grads"].keys()
    for name, grad in expected["grads"].items():
        # each tensor to 1e-5 of its largest entry: a gradient counted twice or lost would be off by 100%
        scale = max(float(grad.abs().max()), 1e-6)
        assert float((got["grads"][name] - grad).abs().max()) <= 1e-5 * scale, name
    for name, weight in expected["weights"].items():
        # atol: AdamW's first step moves near-zero gradients by ~lr * sign, which float noise can flip
        torch.testing.assert_close(got["weights"][name], weight, rtol=1e-4, atol=1e-3, msg=name)
