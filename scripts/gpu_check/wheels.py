"""The wheels `make test-gpu` carries to a GPU machine with no network, and their install there.

    .venv/bin/python -m scripts.gpu_check.wheels download [--dest .whl]    # here, with a registry
    python3 -m scripts.gpu_check.wheels install [--wheels .whl] [--target DIR]   # there, offline

download: the project's runtime dependencies (pyproject's [project] dependencies and theirs, as
installed in this venv: the versions the tests ran with) as CPython 3.12 manylinux x86-64 wheels,
except the packages the device image already holds and the project takes as they are there (torch
and the big compiled ones: IMAGE_HAS). grpcio and protobuf are carried although the image has them,
since the generated stubs need at least the versions they were generated with.

install: if the project already imports (and its embedded config validates) with the interpreter's
own packages, nothing is installed; else every carried wheel goes into --target with pip, offline
(`--no-index --no-deps`), and the import is tried again. Standard library only (it runs before the
project's dependencies exist); the download side imports `packaging` lazily.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]
TARGET_PYTHON = "3.12"  # the device image's python3 (3.12.3, /work/.library/device/KINDS.md)
# pip matches each --platform tag exactly, so several are named. The image's glibc is not recorded
# (KINDS.md); a wheel of a newer tag than the image's glibc would fail there at import, which
# `install` reports (the probe).
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)) + (
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# In the device image ('cuda', KINDS.md "Python packages already there", read 2026-11-17) and used as
# they are: torch must be the image's CUDA build; the rest are large or compiled and not pinned tight.
IMAGE_HAS = frozenset(
    {
        "torch", "numpy", "transformers", "tokenizers", "safetensors", "huggingface-hub", "tensorboard",
        "pyarrow", "sympy", "pyyaml", "aiohttp", "prometheus-client",
    }
)  # fmt: skip
PROBE = (
    "import services.cli.main, services.trainer.engine, services.explorer.build, "
    "services.buffer.server, services.synchronizer.server\n"
    "from services.common.config.loader import load_config\n"
    "load_config(None)\n"
)


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(
    roots: Iterable[str],
    requires: Mapping[str, Sequence[str]],
    *,
    skip: frozenset[str] = IMAGE_HAS,
    python_version: str = TARGET_PYTHON,
) -> list[str]:
    """Canonical names reachable from the requirement strings `roots` through `requires` (name →
    its requirement strings, markers and all), skipping `skip` (and what only they need) and the
    requirements whose marker is false on `python_version`, Linux x86-64, for the extras asked for
    (`sqlalchemy[asyncio]` brings greenlet; extras nobody asks for bring nothing). Sorted."""
    from packaging.requirements import Requirement

    env = {"python_version": python_version, "python_full_version": f"{python_version}.0"}
    env.update(sys_platform="linux", platform_system="Linux", platform_machine="x86_64")
    env.update(platform_python_implementation="CPython", implementation_name="cpython")
    names: set[str] = set()
    expanded: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(r, frozenset()) for r in roots]
    while todo:
        text, wanted_extras = todo.pop()
        req = Requirement(text)
        name = canonical(req.name)
        if name in skip:
            continue
        if req.marker is not None and not any(
            req.marker.evaluate({**env, "extra": e}) for e in (wanted_extras or {""})
        ):
            continue
        key = (name, frozenset(req.extras))
        names.add(name)
        if key not in expanded:
            expanded.add(key)
            todo.extend((child, key[1]) for child in requires.get(name, ()))
    return sorted(names)


def _installed_requires() -> dict[str, list[str]]:
    from importlib import metadata

    return {canonical(d.metadata["Name"]): list(d.requires or []) for d in metadata.distributions()}


def _project_dependencies() -> list[str]:
    import tomllib

    return list(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])


def download(dest: pathlib.Path) -> int:
    from importlib import metadata

    names = closure(_project_dependencies(), _installed_requires())
    pins = [f"{n}=={metadata.version(n)}" for n in names]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd += ["--python-version", TARGET_PYTHON, "--implementation", "cp"]
    cmd += [a for p in PLATFORMS for a in ("--platform", p)]
    print("carrying:", " ".join(pins))
    code = subprocess.call([*cmd, *pins])
    if code == 0:
        wheels = sorted(dest.glob("*.whl"))
        size = sum(w.stat().st_size for w in wheels) / 2**20
        print(f"{len(wheels)} wheels, {size:.1f} MiB in {dest} (the device call's carry limit is 64 MiB)")
    return code


def _probe(python: str, target: pathlib.Path) -> subprocess.CompletedProcess[str]:
    path = [
        str(target),
        str(REPO),
        str(REPO / "gen"),
        *filter(None, os.environ.get("PYTHONPATH", "").split(":")),
    ]
    env = {**os.environ, "PYTHONPATH": ":".join(path)}
    return subprocess.run(
        [python, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def install(wheels: pathlib.Path, target: pathlib.Path, python: str = sys.executable) -> int:
    first = _probe(python, target)
    if first.returncode == 0:
        print(f"the project imports with {python}'s packages (and {target}); nothing to install")
        return 0
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not found:
        print(
            f"the project does not import and {wheels}/ holds no wheels:\n{first.stderr[-2000:]}",
            file=sys.stderr,
        )
        print("make them here with `make gpu-wheels` and carry the folder (docs/gpu.md)", file=sys.stderr)
        return 1
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
    cmd += ["--upgrade", "--target", str(target), *map(str, found)]
    print(f"installing {len(found)} carried wheels into {target}")
    if subprocess.call(cmd) != 0:
        return 1
    second = _probe(python, target)
    if second.returncode != 0:
        print(f"the project still does not import:\n{second.stderr[-2000:]}", file=sys.stderr)
        return 1
    print("the project imports")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.gpu_check.wheels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    down = sub.add_parser("download", help="fetch the wheels (here, with a registry)")
    down.add_argument("--dest", type=pathlib.Path, default=REPO / ".whl")
    inst = sub.add_parser("install", help="install them where the project does not import (offline)")
    inst.add_argument("--wheels", type=pathlib.Path, default=REPO / ".whl")
    inst.add_argument("--target", type=pathlib.Path, default=pathlib.Path("/tmp/trinity-gpu-site"))
    args = parser.parse_args(argv)
    if args.command == "download":
        return download(args.dest)
    return install(args.wheels, args.target)


if __name__ == "__main__":
    sys.exit(main())
