"""scripts/gpu_check/__main__.py: selection from the command line, the summary file, the exit code.
Only the checks that cost nothing run here (the CUDA-only checks, hidden by --cpu: SKIP)."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from scripts.gpu_check.__main__ import main, parse_args


@pytest.fixture
def keep_cuda_env():
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    yield
    if saved is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = saved


def test_parse_args_splits_comma_lists() -> None:
    args = parse_args(["--only", "bf16, fsdp,", "--skip", "demo", "--require-cuda"])
    assert args.only == ["bf16", "fsdp"] and args.skip == ["demo"] and args.require_cuda and not args.cpu


def test_cpu_run_of_cost_free_checks_writes_the_summary(
    tmp_path: pathlib.Path, capsys, keep_cuda_env
) -> None:
    out = tmp_path / "summary.json"
    code = main(["--cpu", "--only", "bf16,device", "--out", str(out), "--work", str(tmp_path / "work")])
    assert code == 0  # two SKIPs are no failure
    lines = capsys.readouterr().out.splitlines()
    assert "SKIP bf16 (0.0 s) -- needs a CUDA device (torch sees none, or --cpu hid it)" in lines
    assert "SKIP device (0.0 s) -- needs a CUDA device (torch sees none, or --cpu hid it)" in lines
    summary = json.loads(out.read_text())
    assert [c["name"] for c in summary["checks"]] == ["device", "bf16"]
    assert summary["status"] == "PASS" and summary["counts"] == {"PASS": 0, "FAIL": 0, "SKIP": 2}
    assert summary["environment"]["cpu_forced"] is True and summary["environment"]["cuda_available"] is False


def test_require_cuda_turns_a_missing_device_into_a_failure(tmp_path: pathlib.Path, keep_cuda_env) -> None:
    out = tmp_path / "s.json"
    assert (
        main(["--cpu", "--require-cuda", "--only", "device", "--out", str(out), "--work", str(tmp_path)]) == 1
    )
    assert json.loads(out.read_text())["checks"][0]["status"] == "FAIL"


def test_an_unknown_check_name_is_a_usage_error(tmp_path: pathlib.Path, capsys) -> None:
    assert main(["--only", "dmeo", "--out", str(tmp_path / "s.json"), "--work", str(tmp_path)]) == 2
    assert (
        "unknown check(s) dmeo; known: device, bf16, memory, sync, fsdp, bench, demo, colocate"
        in capsys.readouterr().err
    )
