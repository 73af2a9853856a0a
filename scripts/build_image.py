"""Build the trinity-grpc image (deploy/compose/Dockerfile), online or with no registry at all.

Usage: python scripts/build_image.py [--tag trinity-grpc:cpu] [--offline] [--force]   (`make image`)

1. The base image (the Dockerfile's PYTHON_IMAGE, python:3.11-slim-bookworm): used if present, else
   pulled; where nothing can be pulled it is made locally: `mmdebstrap` of Debian bookworm from the
   host's apt mirror (python3 3.11, venv, systemd for the systemd test image), `docker import`, tagged
   with the same name.
2. The wheelhouse (deploy/compose/wheelhouse/): with --offline, or when the base had to be made
   locally, `pip wheel` of torch (this venv's CPU build) and every dependency on the host; the
   Dockerfile then installs from it with no index. Rebuilt only when pyproject.toml or the torch pin
   change.
3. `docker build`, skipped when the image already carries the content hash of everything it is built
   from (Dockerfile, pyproject.toml, README.md, gen/, services/, the wheel names); prints the size.
   Before and after, the images an earlier build left untagged are removed (they carry the hash
   label; the systemd test image inherits it), so rebuilds do not fill the disk; a build needs
   MIN_FREE_GB free where Docker keeps its images and stops with a clear message when it is not.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "compose" / "Dockerfile"
WHEELHOUSE = ROOT / "deploy" / "compose" / "wheelhouse"
BASE_IMAGE = "python:3.11-slim-bookworm"
HASH_LABEL = "org.trinity-grpc.source-hash"
STAGE_LABEL = "org.trinity-grpc.stage=build"  # the Dockerfile's build stage
# python-is-python3: `python` as in the official image; systemd-sysv + dbus: systemd as PID 1 in the
# systemd test image (tests/deploy/test_systemd.py) built on top of the same base.
BASE_PACKAGES = "python3,python3-venv,python-is-python3,ca-certificates,systemd-sysv,dbus"
CONSTRAINTS = ROOT / ".venv" / "constraints.txt"
# The build stage unpacks torch and the venv (~2 GB) and the final image copies it again.
MIN_FREE_GB = 6.0


def _say(message: str) -> None:
    print(f"build_image: {message}", flush=True)


def _docker(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _apt_mirror() -> str:
    """The host's Debian mirror (deb822 `URIs:` or a one-line `deb` entry)."""
    sources = sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*")) + [
        pathlib.Path("/etc/apt/sources.list")
    ]
    for path in sources:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and "security" not in line:
                return words[1]
            if words[:1] == ["deb"] and "security" not in line:
                return next(w for w in words[1:] if "://" in w)
    return "http://deb.debian.org/debian"


def ensure_base(image: str = BASE_IMAGE) -> bool:
    """Make `image` present. Returns True when it had to be made locally (no registry)."""
    if _docker("image", "inspect", image).returncode == 0:
        return (
            _docker("image", "inspect", "--format", "{{.Config.Labels}}", image).stdout.count("local-base")
            > 0
        )
    _say(f"pulling {image}")
    if _docker("pull", image, timeout=600).returncode == 0:
        return False
    if shutil.which("mmdebstrap") is None:
        sys.exit(
            f"build_image: {image} cannot be pulled and mmdebstrap is missing (scripts/docker_host.py install)"
        )
    cache = ROOT / ".cache" / "deploy"
    cache.mkdir(parents=True, exist_ok=True)
    tar = cache / "base.tar"
    mirror = _apt_mirror()
    _say(f"{image} cannot be pulled: mmdebstrap bookworm from {mirror} (~1 min)")
    started = time.monotonic()
    subprocess.run(
        [
            "mmdebstrap",
            "--quiet",
            "--variant=apt",
            f"--include={BASE_PACKAGES}",
            "bookworm",
            str(tar),
            f"deb {mirror} bookworm main",
        ],
        check=True,
    )
    done = _docker(
        "import",
        "--change",
        "ENV LANG=C.UTF-8",
        "--change",
        'CMD ["python3"]',
        "--change",
        "LABEL org.trinity-grpc.local-base=1",
        str(tar),
        image,
    )
    if done.returncode != 0:
        sys.exit(f"build_image: docker import failed: {done.stderr}")
    tar.unlink()
    _say(f"{image} made locally in {time.monotonic() - started:.0f} s")
    return True


def _wheel_key() -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    digest.update(CONSTRAINTS.read_bytes() if CONSTRAINTS.exists() else b"")
    return digest.hexdigest()[:16]


def fill_wheelhouse() -> None:
    """Wheels of torch and every dependency, built on the host (Python 3.11, like the base image)."""
    stamp = WHEELHOUSE / ".key"
    if stamp.exists() and stamp.read_text() == _wheel_key() and any(WHEELHOUSE.glob("torch-*.whl")):
        _say("wheelhouse up to date")
        return
    if sys.version_info[:2] != (3, 11):
        sys.exit(
            "build_image: the wheelhouse must be built by Python 3.11 (the base image's); run it from .venv of python3.11"
        )
    _say("pip wheel: torch and the dependencies into deploy/compose/wheelhouse/")
    for old in WHEELHOUSE.glob("*.whl"):
        old.unlink()
    constraints = ["-c", str(CONSTRAINTS)] if CONSTRAINTS.exists() else []
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "-w",
        str(WHEELHOUSE),
        *constraints,
        str(ROOT),
        "setuptools>=77",
        "wheel",
    ]
    subprocess.run(cmd, check=True)
    for own in WHEELHOUSE.glob("trinity_grpc-*.whl"):  # the Dockerfile builds the package from source
        own.unlink()
    stamp.write_text(_wheel_key())


def source_hash() -> str:
    digest = hashlib.sha256()
    files = [DOCKERFILE, ROOT / ".dockerignore", ROOT / "pyproject.toml", ROOT / "README.md"]
    for folder in ("gen", "services"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    for wheel in sorted(WHEELHOUSE.glob("*.whl")):
        digest.update(wheel.name.encode())
    return digest.hexdigest()[:16]


def prune_stale() -> None:
    """Remove what earlier builds left untagged: our images (hash label) and all but the newest
    build-stage image (the layer cache of the next build)."""
    done = _docker("image", "prune", "--force", "--filter", f"label={HASH_LABEL}")
    reclaimed = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else [done.stderr.strip()]
    stages = _docker(
        "images", "--quiet", "--filter", "dangling=true", "--filter", f"label={STAGE_LABEL}"
    ).stdout.split()  # newest first
    for old in stages[1:]:
        _docker("image", "rm", old)
    _say(f"stale images pruned: {' '.join(reclaimed) or 'none'}; old build stages removed: {len(stages[1:])}")


def check_space() -> None:
    """Stop with a clear message, before `docker build` fails half-way with ENOSPC."""
    root = _docker("info", "--format", "{{.DockerRootDir}}").stdout.strip() or "/var/lib/docker"
    free_gb = shutil.disk_usage(root if os.path.isdir(root) else "/").free / 1e9
    if free_gb < MIN_FREE_GB:
        sys.exit(
            f"build_image: {free_gb:.1f} GB free under {root}, the build needs {MIN_FREE_GB:.0f} GB; "
            "free some (`docker system df`, `docker image prune`)"
        )


def build(tag: str, force: bool = False) -> None:
    wanted = source_hash()
    label = _docker(
        "image", "inspect", "--format", f'{{{{index .Config.Labels "{HASH_LABEL}"}}}}', tag
    ).stdout.strip()
    if label == wanted and not force:
        _say(f"{tag} is up to date (source hash {wanted}): not rebuilt")
    else:
        prune_stale()
        check_space()
        _say(f"docker build {tag} (source hash {wanted})")
        started = time.monotonic()
        cmd = [
            "docker",
            "build",
            "--pull=false",
            "-f",
            str(DOCKERFILE),
            "-t",
            tag,
            "--label",
            f"{HASH_LABEL}={wanted}",
            str(ROOT),
        ]
        # The classic builder: BuildKit would need the buildx plugin and a frontend image from a registry.
        done = subprocess.run(cmd, env={**os.environ, "DOCKER_BUILDKIT": "0"}, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"build_image: docker build failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
        _say(f"built in {time.monotonic() - started:.0f} s")
        prune_stale()
    size = int(_docker("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())
    _say(f"{tag}: {size / 1e9:.2f} GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="trinity-grpc:cpu")
    parser.add_argument("--offline", action="store_true", help="install from a host-built wheelhouse")
    parser.add_argument("--force", action="store_true", help="rebuild even when the source hash matches")
    args = parser.parse_args()
    local_base = ensure_base()
    if args.offline or local_base:
        fill_wheelhouse()
    build(args.tag, args.force)


if __name__ == "__main__":
    main()
