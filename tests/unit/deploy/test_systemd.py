"""deploy/systemd: what the units promise (systemd-analyze verify runs in
tests/integration/test_deploy_validators.py; ExecStart runs in tests/integration/test_deploy_commands.py)."""

from __future__ import annotations

import pathlib
import re
import shlex
from graphlib import TopologicalSorter

import pytest

from services.cli.main import build_parser
from services.common.config import load_config
from services.common.config.services import SERVICE_NAMES
from tests.conftest import REPO

SYSTEMD = REPO / "deploy" / "systemd"


def unit(path: pathlib.Path) -> dict[str, list[str]]:
    """`Section.Key` -> values in order (keys repeat)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


TEMPLATE = unit(SYSTEMD / "trinity-grpc@.service")
TARGET = unit(SYSTEMD / "trinity-grpc.target")


def one(key: str, parsed: dict[str, list[str]] = TEMPLATE) -> str:
    values = parsed[key]
    assert len(values) == 1, (key, values)
    return values[0]


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(s|min)?", value)
    assert match, value
    return int(match.group(1)) * (60 if match.group(2) == "min" else 1)


@pytest.fixture(scope="module")
def cfg():
    return load_config(SYSTEMD / "config.yaml")


def env_file() -> dict[str, str]:
    lines = (SYSTEMD / "trinity-grpc.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_exec_start_serves_the_instance_with_the_config_from_the_environment_file() -> None:
    argv = shlex.split(one("Service.ExecStart"))
    assert argv[0] == "/opt/trinity-grpc/.venv/bin/trinity"
    args = build_parser().parse_args([a.replace("%i", "buffer") for a in argv[1:]])
    assert (args.command, args.service, args.config) == ("serve", "buffer", "${TRINITY_CONFIG}")
    assert "/etc/trinity-grpc/trinity-grpc.env" in TEMPLATE["Service.EnvironmentFile"]
    assert env_file()["TRINITY_CONFIG"] == "/etc/trinity-grpc/config.yaml"


def test_restart_and_stop_match_the_graceful_shutdown(cfg) -> None:
    assert one("Service.Restart") == "on-failure"
    assert one("Service.RestartPreventExitStatus") == "2"  # invalid config: retrying cannot help
    assert one("Service.KillSignal") == "SIGTERM" and one("Service.KillMode") == "mixed"
    assert seconds(one("Service.TimeoutStopSec")) > cfg.services.shutdown_grace_s + 30


def test_readiness_is_sd_notify() -> None:
    assert one("Service.Type") == "notify"
    assert one("Service.NotifyAccess") in ("main", "all")


def test_dedicated_user_and_state_under_var_lib(cfg) -> None:
    user = one("Service.User")
    assert user == "trinity-grpc" and one("Service.Group") == user
    sysusers = (SYSTEMD / "trinity-grpc.sysusers.conf").read_text().splitlines()
    entry = next(line.split() for line in sysusers if line.startswith("u "))
    assert entry[1] == user and "/var/lib/trinity-grpc" in entry
    assert one("Service.StateDirectory") == "trinity-grpc"
    assert one("Service.WorkingDirectory") == "/var/lib/trinity-grpc"
    env = env_file()
    for key in ("TRINITY_CHECKPOINT_ROOT_DIR", "TRINITY_BUFFER_DATA_DIR"):
        assert env[key].startswith("/var/lib/trinity-grpc/")
    assert cfg.checkpoint_root_dir == "/var/lib/trinity-grpc/runs"
    assert cfg.buffer.data_dir == env["TRINITY_BUFFER_DATA_DIR"]


def test_hardening_is_on_without_the_options_that_break_torch() -> None:
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "RestrictSUIDSGID": "yes",
        "ProtectKernelModules": "yes",
    }.items():
        assert one(f"Service.{key}") == value, key
    for breaks_torch in ("PrivateDevices", "MemoryDenyWriteExecute", "ProcSubset", "SystemCallFilter"):
        assert f"Service.{breaks_torch}" not in TEMPLATE, breaks_torch
    families = one("Service.RestrictAddressFamilies").split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)


def test_target_wants_all_four_and_dropins_order_them() -> None:
    wants = one("Unit.Wants", TARGET).split()
    assert wants == [f"trinity-grpc@{s}.service" for s in SERVICE_NAMES]
    graph: dict[str, set[str]] = {s: set() for s in SERVICE_NAMES}
    for dropin in SYSTEMD.glob("trinity-grpc@*.service.d/*.conf"):
        service = dropin.parent.name.removeprefix("trinity-grpc@").removesuffix(".service.d")
        after = unit(dropin).get("Unit.After", [])
        graph[service] |= {
            a.removeprefix("trinity-grpc@").removesuffix(".service") for v in after for a in v.split()
        }
        assert "Unit.Requires" not in unit(dropin) and "Unit.BindsTo" not in unit(dropin)
    order = list(TopologicalSorter(graph).static_order())
    assert order == list(SERVICE_NAMES)
    assert graph["explorer"] == {"buffer", "synchronizer", "trainer"}
    assert one("Unit.PartOf") == "trinity-grpc.target"


def test_systemd_example_config_is_valid_and_on_the_default_ports(cfg) -> None:
    ports = [cfg.services.endpoint(s).port for s in SERVICE_NAMES]
    assert ports == [50051, 50052, 50053, 50054]


def test_systemd_example_config_serves_metrics_on_loopback(cfg) -> None:
    # ExecStart passes only --config: the metrics ports come from it, bound where gRPC binds.
    ports = [cfg.services.endpoint(s).metrics_port for s in SERVICE_NAMES]
    assert ports == [9451, 9452, 9453, 9454]
    assert {cfg.services.endpoint(s).bind_host for s in SERVICE_NAMES} == {"127.0.0.1"}


def test_torchrun_dropin_replaces_exec_start_with_the_trainer_module() -> None:
    dropin = unit(SYSTEMD / "trainer-torchrun.conf.example")
    assert dropin["Service.ExecStart"][0] == ""  # reset the template's ExecStart first
    argv = shlex.split(dropin["Service.ExecStart"][1])
    assert argv[0] == "/opt/trinity-grpc/.venv/bin/torchrun"
    assert argv[argv.index("-m") + 1] == "services.trainer"
    assert argv[argv.index("--config") + 1] == "${TRINITY_CONFIG}"
    assert "--nproc-per-node=${TRAINER_GPUS}" in argv
