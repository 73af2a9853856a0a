"""scripts/gpu_check/report.py: which checks run, how an outcome becomes a line, the JSON summary, the
exit code. The checks here are plain functions standing in for the real ones (no torch)."""

from __future__ import annotations

import json
import pathlib

import pytest

from scripts.gpu_check.report import (
    FAIL,
    PASS,
    SKIP,
    Check,
    CheckFailed,
    CheckSkipped,
    Result,
    exit_code,
    format_line,
    run_check,
    select,
    summary,
    summary_path,
)


def _passes(ctx: object) -> dict[str, object]:
    return {"ratio": 0.91234, "device": "cuda"}


def _fails(ctx: object) -> dict[str, object]:
    raise CheckFailed("loss did not fall", {"loss_first": 10.0, "loss_last": 10.5})


def _skips(ctx: object) -> dict[str, object]:
    raise CheckSkipped("not implemented")


def _crashes(ctx: object) -> dict[str, object]:
    raise RuntimeError("CUDA error: an illegal memory access\nsecond line")


CHECKS = (
    Check("device", "d", _passes, needs_cuda=True),
    Check("bf16", "b", _passes, needs_cuda=True),
    Check("sync", "s", _passes),
    Check("demo", "m", _passes),
)


def test_select_keeps_the_registry_order_and_applies_only_then_skip() -> None:
    assert [c.name for c in select(CHECKS)] == ["device", "bf16", "sync", "demo"]
    assert [c.name for c in select(CHECKS, only=["demo", "device"])] == ["device", "demo"]
    assert [c.name for c in select(CHECKS, skip=["bf16", "demo"])] == ["device", "sync"]
    assert [c.name for c in select(CHECKS, only=["sync", "demo"], skip=["demo"])] == ["sync"]


def test_select_refuses_unknown_names_and_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown check\(s\) bf61, dmeo; known: device, bf16, sync, demo"):
        select(CHECKS, only=["dmeo"], skip=["bf61"])


def test_run_check_outcomes() -> None:
    ticks = iter([1.0, 3.5])
    passed = run_check(CHECKS[2], None, cuda=False, clock=lambda: next(ticks))
    assert (passed.status, passed.seconds, passed.figures) == (
        PASS,
        2.5,
        {"ratio": 0.91234, "device": "cuda"},
    )

    failed = run_check(Check("x", "", _fails), None, cuda=True)
    assert failed.status == FAIL and failed.detail == "loss did not fall"
    assert failed.figures == {"loss_first": 10.0, "loss_last": 10.5}  # what it measured is kept

    skipped = run_check(Check("colocate", "", _skips), None, cuda=True)
    assert (skipped.status, skipped.detail) == (SKIP, "not implemented")

    crashed = run_check(Check("x", "", _crashes), None, cuda=True)
    assert crashed.status == FAIL
    assert crashed.detail == "RuntimeError: CUDA error: an illegal memory access"  # first line only
    assert "Traceback" in crashed.trace and "_crashes" in crashed.trace


def test_a_cuda_check_without_cuda_skips_or_fails_when_cuda_is_required() -> None:
    calls = []
    check = Check("bf16", "", lambda ctx: calls.append(ctx) or {}, needs_cuda=True)
    assert run_check(check, "ctx", cuda=False).status == SKIP
    required = run_check(check, "ctx", cuda=False, require_cuda=True)
    assert required.status == FAIL and "needs a CUDA device" in required.detail
    assert calls == []  # never run without the device
    assert run_check(check, "ctx", cuda=True).status == PASS and calls == ["ctx"]


def test_format_line() -> None:
    line = format_line(
        Result("bench", PASS, 12.345, figures={"ratio": 0.91234, "ok": True, "per_step": [1.5, 2.0]})
    )
    assert line == "PASS bench (12.3 s): ratio=0.9123 ok=true per_step=[1.5,2]"
    assert (
        format_line(Result("colocate", SKIP, 0.0, "not implemented"))
        == "SKIP colocate (0.0 s) -- not implemented"
    )
    big = format_line(Result("x", FAIL, 1.0, "slow", {"tokens_s": 123456.7, "loss": float("nan")}))
    assert big == "FAIL x (1.0 s): tokens_s=123457 loss=nan -- slow"


def test_summary_counts_status_and_json_shape() -> None:
    results = [
        Result("device", PASS, 1.0, figures={"device_name": "NVIDIA H100"}),
        Result("bf16", FAIL, 2.25, "loss did not fall", {"loss": float("inf")}, trace="Traceback ..."),
        Result("colocate", SKIP, 0.0, "not implemented"),
    ]
    out = summary(results, {"torch": "2.11.0"})
    assert json.loads(json.dumps(out)) == out  # plain JSON: no NaN/inf left
    assert out["status"] == FAIL and out["counts"] == {"PASS": 1, "FAIL": 1, "SKIP": 1}
    assert out["seconds"] == 3.2 and out["environment"] == {"torch": "2.11.0"} and out["version"] == 1
    assert out["checks"][1] == {
        "name": "bf16",
        "status": FAIL,
        "seconds": 2.25,
        "detail": "loss did not fall",
        "figures": {"loss": "inf"},
        "trace": "Traceback ...",
    }
    assert "trace" not in out["checks"][0]
    assert summary(results[::2], {})["status"] == PASS


def test_exit_code_is_one_only_on_a_failure() -> None:
    assert exit_code([Result("a", PASS, 0), Result("b", SKIP, 0)]) == 0
    assert exit_code([Result("a", PASS, 0), Result("b", FAIL, 0)]) == 1
    assert exit_code([]) == 0


def test_summary_path_prefers_out_then_the_device_folder(tmp_path: pathlib.Path) -> None:
    assert summary_path(str(tmp_path / "s.json"), {"OUT": "/out"}) == tmp_path / "s.json"
    assert summary_path(str(tmp_path), {}) == tmp_path / "gpu_check.json"  # a folder
    assert summary_path(None, {"OUT": "/out"}) == pathlib.Path("/out/gpu_check.json")
    assert summary_path(None, {}) == pathlib.Path("runs/gpu_check/gpu_check.json")
