"""Entry point of the GPU check (see the package docstring); heavy imports wait until after --cpu."""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from scripts.gpu_check import report

REPO = pathlib.Path(__file__).resolve().parents[2]


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.gpu_check", description=__doc__)
    parser.add_argument("--cpu", action="store_true", help="hide any CUDA device: CUDA-only checks SKIP")
    parser.add_argument(
        "--require-cuda",
        action="store_true",
        help="a CUDA-only check with no CUDA device FAILs (device runs)",
    )
    parser.add_argument("--only", type=_names, default=[], help="comma-separated checks to run (default all)")
    parser.add_argument("--skip", type=_names, default=[], help="comma-separated checks to leave out")
    parser.add_argument(
        "--out", default=None, help="summary file or folder (default $OUT, else runs/gpu_check/)"
    )
    parser.add_argument("--work", default=str(REPO / "runs" / "gpu_check"), help="scratch folder")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    return parser.parse_args(argv)


def _commit() -> str:
    """The checkout's commit, with `-dirty` when the files differ from it (a copied working tree
    whose .git is older, as the lent GPU machines get, reads e.g. `1bf947b-dirty`)."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _environment(lab_env: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    return {
        **lab_env,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "commit": _commit(),
        "argv": sys.argv[1:],
        "cpu_forced": args.cpu,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _free_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported; the children inherit it
    from scripts.gpu_check import lab
    from scripts.gpu_check.registry import CHECKS

    if args.list:
        for check in CHECKS:
            print(f"{check.name:10} {'cuda' if check.needs_cuda else 'any '}  {check.summary}")
        return 0
    try:
        selected = report.select(CHECKS, args.only, args.skip)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    cuda = torch.cuda.is_available()
    work = pathlib.Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    ctx = lab.Context("cuda" if cuda else "cpu", work, REPO, sys.executable)
    out = report.summary_path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    environment = _environment(lab.cuda_environment(), args)
    print(f"gpu check on {environment.get('device_name', 'CPU (no CUDA device)')}, torch {torch.__version__}")
    results: list[report.Result] = []
    for check in selected:
        print(f"... {check.name}: {check.summary}", flush=True)
        result = report.run_check(check, ctx, cuda=cuda, require_cuda=args.require_cuda)
        results.append(result)
        if result.trace:
            print(result.trace, file=sys.stderr)
        print(report.format_line(result), flush=True)
        _free_device_memory()
        # written after every check: a run cut off at its time limit still leaves what it found
        out.write_text(json.dumps(report.summary(results, environment), indent=2) + "\n")
    counts = report.summary(results, environment)["counts"]
    print(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped; summary: {out}")
    return report.exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
