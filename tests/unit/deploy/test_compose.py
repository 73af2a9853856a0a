"""deploy/compose: the compose files, the Dockerfile and the config agree (the Compose Specification
schema itself runs in tests/integration/test_deploy_validators.py; the commands run in
tests/integration/test_deploy_commands.py)."""

from __future__ import annotations

import fnmatch
import re

import pytest
import yaml

from services.cli.main import build_parser
from services.common.config import load_config
from services.common.config.services import SERVICE_NAMES
from tests.conftest import REPO

COMPOSE_DIR = REPO / "deploy" / "compose"
COMPOSE = yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())
GPU = yaml.safe_load((COMPOSE_DIR / "compose.gpu.yaml").read_text())
MONITORING = yaml.safe_load((COMPOSE_DIR / "compose.monitoring.yaml").read_text())
PROMETHEUS = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
CONFIG_TARGET = "/etc/trinity-grpc/config.yaml"


@pytest.fixture(scope="module")
def cfg():
    return load_config(COMPOSE_DIR / "config.yaml")


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for raw in (COMPOSE_DIR / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    return instructions


def volumes(service: str) -> list[tuple[str, str, str]]:
    """(source, target, mode) of a service's short-syntax volumes."""
    out = []
    for volume in COMPOSE["services"][service].get("volumes", []):
        parts = volume.split(":")
        out.append((parts[0], parts[1], parts[2] if len(parts) > 2 else "rw"))
    return out


def test_four_services_each_serving_itself_with_the_read_only_config() -> None:
    assert list(COMPOSE["services"]) == list(SERVICE_NAMES)
    entrypoint = next(yaml.safe_load(a) for i, a in dockerfile() if i == "ENTRYPOINT")
    assert entrypoint == ["trinity"]
    for name, spec in COMPOSE["services"].items():
        args = build_parser().parse_args(spec["command"])
        assert (args.command, args.service, args.config) == ("serve", name, CONFIG_TARGET)
        assert ("./config.yaml", CONFIG_TARGET, "ro") in volumes(name)


def test_healthchecks_use_the_grpc_health_probe_on_the_configured_port(cfg) -> None:
    for name, spec in COMPOSE["services"].items():
        test = spec["healthcheck"]["test"]
        assert test[:3] == ["CMD", "trinity", "health"]
        args = build_parser().parse_args(test[1:][1:])
        assert args.address == f"127.0.0.1:{cfg.services.endpoint(name).port}"
        assert args.timeout < int(spec["healthcheck"]["timeout"].rstrip("s"))


def test_services_start_in_order_each_once_the_previous_ones_are_healthy() -> None:
    for index, name in enumerate(SERVICE_NAMES):
        depends = COMPOSE["services"][name].get("depends_on", {})
        assert set(depends) == set(SERVICE_NAMES[:index])
        assert all(d["condition"] == "service_healthy" for d in depends.values())


def test_stop_grace_exceeds_the_servers_shutdown_grace(cfg) -> None:
    for spec in COMPOSE["services"].values():
        grace = int(re.fullmatch(r"(\d+)s", spec["stop_grace_period"]).group(1))
        assert grace > cfg.services.shutdown_grace_s and spec["stop_signal"] == "SIGTERM"


def test_volumes_sqlite_only_in_the_buffer_checkpoints_shared_by_trainer_and_explorer(cfg) -> None:
    declared = set(COMPOSE["volumes"])
    for name in SERVICE_NAMES:
        for source, _, _ in volumes(name):
            assert source.startswith("./") or source in declared, (name, source)
    env = COMPOSE["services"]["buffer"]["environment"]
    buffer_mounts = {source: target for source, target, _ in volumes("buffer")}
    assert buffer_mounts["buffer-data"] == env["TRINITY_BUFFER_DATA_DIR"]
    for name in SERVICE_NAMES:
        if name != "buffer":
            assert "buffer-data" not in {s for s, _, _ in volumes(name)}
    for name in ("trainer", "explorer"):
        mounts = {source: target for source, target, _ in volumes(name)}
        assert (
            mounts["checkpoints"] == COMPOSE["services"][name]["environment"]["TRINITY_CHECKPOINT_ROOT_DIR"]
        )
    assert cfg.synchronizer.sync_method == "checkpoint"


def test_config_uses_compose_service_names_and_binds_all_interfaces(cfg) -> None:
    for name in SERVICE_NAMES:
        endpoint = cfg.services.endpoint(name)
        assert (endpoint.host, endpoint.bind) == (name, "0.0.0.0")
    ports = [p for spec in COMPOSE["services"].values() for p in spec.get("ports", [])]
    for port in ports:
        # "127.0.0.1:${TRINITY_<SERVICE>_HOST_PORT:-50051}:50051": the default host port is the container's
        match = re.fullmatch(r"127\.0\.0\.1:\$\{TRINITY_[A-Z]+_HOST_PORT:-(\d+)\}:(\d+)", port)
        assert match, port
        host_port, container_port = match.groups()
        assert host_port == container_port
        assert int(container_port) in {cfg.services.endpoint(n).port for n in SERVICE_NAMES}


def test_taskset_of_the_config_is_in_a_bind_mount_of_the_buffer(cfg) -> None:
    path = cfg.buffer.explorer_input.taskset.path
    for source, target, mode in volumes("buffer"):
        if path.startswith(target + "/"):
            assert mode == "ro"
            assert (COMPOSE_DIR / source / path.removeprefix(target + "/")).is_file()
            break
    else:
        raise AssertionError(f"{path} is in no volume of the buffer")


def test_gpu_override_builds_the_cuda_variant_and_reserves_gpus() -> None:
    assert set(GPU["services"]) <= set(COMPOSE["services"])
    for name in ("trainer", "explorer"):
        devices = GPU["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    for spec in GPU["services"].values():
        assert spec["image"] == "trinity-grpc:cuda"
        assert "cu" in spec["build"]["args"]["TORCH_INDEX"].rsplit("/", 1)[-1]
    args = {a.split("=")[0].split()[0] for i, a in dockerfile() if i == "ARG"}
    assert set(GPU["services"]["trainer"]["build"]["args"]) <= args


def test_dockerfile_copies_only_what_exists_and_the_dockerignore_lets_through() -> None:
    ignore = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        result = False
        for pattern in ignore:
            negate = pattern.startswith("!")
            pat = pattern.lstrip("!")
            if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat.removesuffix("/**")):
                result = not negate
        return result

    # COPY --from=<stage> copies from an earlier stage, not from the context.
    copies = [a.split() for i, a in dockerfile() if i == "COPY" and not a.startswith("--from=")]
    assert copies
    for *sources, _ in copies:
        for source in sources:
            assert (REPO / source).exists(), source
            assert not ignored(source), f"{source} is excluded by .dockerignore"
    assert ignored("tests") and ignored(".venv") and ignored("tools")


def test_dockerfile_runs_unprivileged_with_the_makefiles_torch_pin() -> None:
    instructions = dockerfile()
    user = [a for i, a in instructions if i == "USER"]
    assert user and user[-1] not in ("root", "0")
    args = dict(a.split("=", 1) for i, a in instructions if i == "ARG" and "=" in a)
    makefile = (REPO / "Makefile").read_text()
    assert f"TORCH_VERSION := {args['TORCH_VERSION']}" in makefile
    assert args["TORCH_INDEX"].endswith("/cpu")
    exposed = {int(p) for i, a in instructions if i == "EXPOSE" for p in a.split()}
    assert exposed == {50051, 50052, 50053, 50054, 9451, 9452, 9453, 9454}
    assert ("STOPSIGNAL", "SIGTERM") in instructions


def test_every_service_serves_metrics_on_its_own_port_of_every_interface(cfg) -> None:
    ports = [cfg.services.endpoint(name).metrics_port for name in SERVICE_NAMES]
    assert ports == [9451, 9452, 9453, 9454]
    for name in SERVICE_NAMES:  # bound where the gRPC server binds: reachable in the project network
        assert cfg.services.endpoint(name).bind_host == "0.0.0.0"


def test_prometheus_override_scrapes_every_service_at_its_configured_metrics_port(cfg) -> None:
    prometheus = MONITORING["services"]["prometheus"]
    assert ("./prometheus.yml", "/etc/prometheus/prometheus.yml", "ro") in [
        tuple((v.split(":") + ["rw"])[:3]) for v in prometheus["volumes"]
    ]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert set(MONITORING["services"]) == {"prometheus"}  # an addition: the four services unchanged
    jobs = {job["job_name"]: job for job in PROMETHEUS["scrape_configs"]}
    assert set(jobs) == {f"trinity-{name}" for name in SERVICE_NAMES}
    for name in SERVICE_NAMES:
        job = jobs[f"trinity-{name}"]
        port = cfg.services.endpoint(name).metrics_port
        if name == "explorer":  # every replica of `--scale explorer=N`
            (sd,) = job["dns_sd_configs"]
            assert (sd["names"], sd["type"], sd["port"]) == ([name], "A", port)
        else:
            assert job["static_configs"] == [{"targets": [f"{name}:{port}"]}]
        assert job.get("metrics_path", "/metrics") == "/metrics"
