"""Refresh the committed proto baseline (tests/contract/baseline/protos_v1.binpb) after an additive change.

Usage: python scripts/proto_baseline.py [--buf PATH]   (or `make proto-baseline`)

The breaking-change check (tests/contract/test_protos.py) compares protos/ with this image, so a
field or RPC added since the last refresh is not protected until the image is rebuilt. The refresh
runs `buf breaking` against the current image first and refuses (exit 1) when that fails: a baseline
must never be rewritten to make a breaking change pass. tests/contract/test_protos.py also fails when
protos/ declares a message, field, enum value, service or RPC that the baseline lacks.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

from google.protobuf import descriptor_pb2

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tests" / "contract" / "baseline" / "protos_v1.binpb"
BUF = ROOT / "tools" / "node" / "node_modules" / ".bin" / "buf"
REFRESH_COMMAND = "make proto-baseline"


def _buf(buf: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(buf), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def build_image(out: pathlib.Path, buf: pathlib.Path = BUF) -> None:
    """`buf build` protos/ into a binary image at `out` (a FileDescriptorSet plus buf's extras)."""
    result = _buf(buf, "build", "-o", str(out))
    if result.returncode != 0:
        raise SystemExit(f"buf build failed:\n{result.stdout}{result.stderr}")


def declared_names(image: pathlib.Path) -> set[str]:
    """Every message, field (with its number), enum value, service and RPC of our packages in `image`.

    Imports such as google/protobuf/struct.proto are left out: they are not ours to version."""
    files = descriptor_pb2.FileDescriptorSet()
    files.ParseFromString(image.read_bytes())
    names: set[str] = set()

    def enum(prefix: str, e: descriptor_pb2.EnumDescriptorProto) -> None:
        names.add(f"enum {prefix}.{e.name}")
        names.update(f"enum value {prefix}.{e.name}.{v.name} = {v.number}" for v in e.value)

    def message(prefix: str, m: descriptor_pb2.DescriptorProto) -> None:
        full = f"{prefix}.{m.name}"
        names.add(f"message {full}")
        names.update(f"field {full}.{f.name} = {f.number}" for f in m.field)
        for nested in m.nested_type:
            message(full, nested)
        for e in m.enum_type:
            enum(full, e)

    for file in files.file:
        if file.name.startswith("google/"):
            continue
        for m in file.message_type:
            message(file.package, m)
        for e in file.enum_type:
            enum(file.package, e)
        for service in file.service:
            names.add(f"service {file.package}.{service.name}")
            names.update(f"rpc {file.package}.{service.name}.{rpc.name}" for rpc in service.method)
    return names


def _shown(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def refresh(baseline: pathlib.Path = BASELINE, buf: pathlib.Path = BUF) -> int:
    """Rebuild `baseline` from protos/ unless protos/ breaks it; returns a process exit code."""
    if baseline.exists():
        check = _buf(buf, "breaking", "--against", str(baseline))
        if check.returncode != 0:
            print(
                f"refusing to refresh {_shown(baseline)}: protos/ breaks it "
                "(fix the change; field numbers and names are never reused):\n" + check.stdout + check.stderr,
                file=sys.stderr,
            )
            return 1
        before = declared_names(baseline)
    else:
        before = set()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = pathlib.Path(tmp) / "protos.binpb"
        build_image(fresh, buf)
        added = sorted(declared_names(fresh) - before)
        baseline.parent.mkdir(parents=True, exist_ok=True)
        baseline.write_bytes(fresh.read_bytes())
    print(f"{_shown(baseline)} refreshed; newly covered: {len(added)}")
    for name in added:
        print(f"  {name}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buf", type=pathlib.Path, default=BUF, help="buf binary (default: tools/node)")
    parser.add_argument("--baseline", type=pathlib.Path, default=BASELINE)
    args = parser.parse_args()
    return refresh(args.baseline.resolve(), args.buf)


if __name__ == "__main__":
    sys.exit(main())
