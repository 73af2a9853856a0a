"""Regenerate the Python stubs in gen/ from protos/.

Usage: python scripts/gen_protos.py [--out DIR]

Stubs land in gen/trinity_grpc/<service>/v1/ (the folders under protos/ mirror the package), with
mypy-protobuf type stubs for messages and async servicers/stubs. protoc writes no __init__.py, so
this script adds them. tests/contract/test_protos.py (test_generated_stubs_are_fresh) regenerates into a temp dir and diffs.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"


def proto_files() -> list[pathlib.Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(out: pathlib.Path) -> None:
    """Write stubs for every proto under protos/ into `out` (replacing out/trinity_grpc)."""
    package_dir = out / "trinity_grpc"
    if package_dir.exists():
        shutil.rmtree(package_dir)
    out.mkdir(parents=True, exist_ok=True)
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    bindir = pathlib.Path(sys.executable).parent
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *[str(p.relative_to(PROTO_ROOT)) for p in proto_files()],
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    for directory in [package_dir, *[p for p in package_dir.rglob("*") if p.is_dir()]]:
        (directory / "__init__.py").touch()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "gen")
    generate(parser.parse_args().out)


if __name__ == "__main__":
    sys.exit(main())
