"""The pure parts of the GPU check: which checks run, their outcome lines, the JSON summary, the exit code.

No torch here, so the unit tests (tests/unit/scripts/gpu_check/) import it in a blink.
"""

from __future__ import annotations

import math
import os
import pathlib
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
SUMMARY_FILE = "gpu_check.json"
SUMMARY_VERSION = 1


class CheckFailed(Exception):
    """A check's assertion did not hold; `figures` are what it measured before it gave up."""

    def __init__(self, message: str, figures: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.figures = dict(figures or {})


class CheckSkipped(Exception):
    """The check cannot run here (no CUDA device, a feature that does not exist yet)."""


@dataclass(frozen=True)
class Check:
    """One check: `run(ctx)` returns its figures, raises CheckFailed / CheckSkipped, or anything else
    (a FAIL naming the exception). `needs_cuda`: SKIP where there is no CUDA device."""

    name: str
    summary: str
    run: Callable[[Any], Mapping[str, Any]]
    needs_cuda: bool = False


@dataclass
class Result:
    name: str
    status: str  # PASS, FAIL or SKIP
    seconds: float
    detail: str = ""  # why it failed or was skipped
    figures: dict[str, Any] = field(default_factory=dict)
    trace: str = ""  # the traceback of an unexpected exception


def run_check(
    check: Check,
    ctx: Any,
    *,
    cuda: bool,
    require_cuda: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> Result:
    """Run one check and turn its outcome into a Result; never raises (a crash is a FAIL).

    A check that needs CUDA where there is none is a SKIP, or a FAIL under `require_cuda` (the run on a
    lent GPU machine, where a missing device is itself the failure)."""
    if check.needs_cuda and not cuda:
        status = FAIL if require_cuda else SKIP
        return Result(check.name, status, 0.0, "needs a CUDA device (torch sees none, or --cpu hid it)")
    t0 = clock()
    try:
        figures = dict(check.run(ctx))
    except CheckSkipped as exc:
        return Result(check.name, SKIP, clock() - t0, str(exc))
    except CheckFailed as exc:
        return Result(check.name, FAIL, clock() - t0, str(exc), exc.figures)
    except Exception as exc:  # a crash of the code under check is what this script is here to report
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        return Result(check.name, FAIL, clock() - t0, detail, trace=traceback.format_exc())
    return Result(check.name, PASS, clock() - t0, figures=figures)


def select(checks: Sequence[Check], only: Iterable[str] = (), skip: Iterable[str] = ()) -> list[Check]:
    """The checks to run, in their own order: `only` (empty: all) minus `skip`.

    An unknown name is an error naming the known ones, so a typo never silently runs nothing."""
    known = [c.name for c in checks]
    only, skip = list(only), list(skip)
    unknown = sorted({n for n in (*only, *skip) if n not in known})
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(known)}")
    wanted = set(only) if only else set(known)
    return [c for c in checks if c.name in wanted and c.name not in set(skip)]


def _figure(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_figure(v) for v in value) + "]"
    return str(value)


def format_line(result: Result) -> str:
    """`PASS name (1.2 s): key=value ...`, with the reason after ` -- ` when there is one."""
    figures = " ".join(f"{k}={_figure(v)}" for k, v in result.figures.items())
    line = f"{result.status} {result.name} ({result.seconds:.1f} s)"
    if figures:
        line += f": {figures}"
    if result.detail:
        line += f" -- {result.detail}"
    return line


def exit_code(results: Sequence[Result]) -> int:
    """1 when any check failed, else 0 (a SKIP is not a failure)."""
    return 1 if any(r.status == FAIL for r in results) else 0


def summary(results: Sequence[Result], environment: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON summary: environment, one entry per check, counts and the overall status."""
    counts = {s: sum(r.status == s for r in results) for s in (PASS, FAIL, SKIP)}
    return {
        "version": SUMMARY_VERSION,
        "status": FAIL if counts[FAIL] else PASS,
        "counts": counts,
        "seconds": round(sum(r.seconds for r in results), 1),
        "environment": dict(environment),
        "checks": [
            {
                "name": r.name,
                "status": r.status,
                "seconds": round(r.seconds, 2),
                "detail": r.detail,
                "figures": _json_safe(r.figures),
                **({"trace": r.trace} if r.trace else {}),
            }
            for r in results
        ],
    }


def _json_safe(value: Any) -> Any:
    """Non-finite floats as strings (JSON has no NaN), containers walked."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def summary_path(out_arg: str | None, environ: Mapping[str, str] = os.environ) -> pathlib.Path:
    """Where the summary goes: --out when given (a file, or a folder to put gpu_check.json in), else
    $OUT/gpu_check.json (the lent device machine's result folder), else runs/gpu_check/gpu_check.json
    (runs/ is ignored by git)."""
    if out_arg:
        path = pathlib.Path(out_arg)
        return path / SUMMARY_FILE if path.is_dir() else path
    if environ.get("OUT"):
        return pathlib.Path(environ["OUT"]) / SUMMARY_FILE
    return pathlib.Path("runs") / "gpu_check" / SUMMARY_FILE
