"""The commands the deploy artifacts run really start the service they claim.

Each command is parsed out of its artifact (systemd ExecStart + EnvironmentFile, compose `command` +
the Dockerfile's ENTRYPOINT, Kubernetes `command`/`args`/`env`, and the `$ ...` lines the files'
comments give), then run as a real process against a copy of that artifact's own config in which
only addresses, ports and paths are changed: the absolute paths the artifacts use (/etc/trinity-grpc,
/var/lib/trinity-grpc, /var/cache/trinity-grpc, /opt/trinity-grpc/.venv/bin) are mapped under a temp
root, every host becomes 127.0.0.1 and every port a free one. Then `trinity health` must say SERVING,
SIGTERM must end it with exit 0, and `trinity health` must fail afterwards.

The systemd and compose layouts run all four services from their own command lines, in one sandbox
per layout (the configs are CPU ones: builtin:tiny-arith), in the order their supervisors start them
(buffer and synchronizer healthy first, then trainer and explorer) and stopped in reverse order. Their
sandbox config also raises buffer.total_epochs, so the job is still running when SIGTERM comes rather
than ending by itself; SIGTERM comes once each trainer has trained at least one step. Just before it,
every service's /metrics (the artifacts' configs set services.<name>.metrics_port) is read as
Prometheus reads it, and the figures of that short run are checked.

Checked for shape only: Kubernetes' trainer and explorer (the trainer is a two-node torchrun,
`--nnodes=2 --master-addr=trinity-trainer-0...`, not reproducible on one machine without rewriting the
command), and the single-node torchrun lines (systemd drop-in example, compose.gpu.yaml). Those would
run on CPU with `--nproc-per-node=1`, but only as a second trainer after the first has stopped (~10 s
more of torch start-up on a 2-core machine), and tests/integration/test_trainer_fsdp.py already runs
the same `torchrun ... -m services.trainer --config F` with two CPU ranks.
"""

from __future__ import annotations

import asyncio
import pathlib
import shlex
import signal
from collections.abc import Iterator

import pytest
import yaml

from services.common.procs import stop_process
from tests.integration.deploy_artifacts import (
    LAUNCH_NAMES,
    comment_commands,
    compose_launches,
    health_address,
    k8s_docs,
    k8s_launches,
    read_unit,
    served_service,
    systemd_launches,
)
from tests.integration.deploy_launch import (
    DEFAULT_PORTS,
    DEPLOY,
    RUNNABLE,
    SERVICES,
    WORKERS,
    Launch,
    exercise,
)
from tests.integration.prometheus_page import families, samples, value


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Iterator[dict[str, Launch]]:
    tmp = tmp_path_factory.mktemp("deploy-commands")
    launches = systemd_launches(tmp) + compose_launches(tmp) + k8s_launches(tmp)
    try:
        asyncio.run(exercise(launches))
        yield {launch.name: launch for launch in launches}
    finally:
        for launch in launches:
            if launch.proc is not None and launch.proc.poll() is None:
                stop_process(launch.proc, signal.SIGKILL, timeout=5)
            if launch.notify is not None:
                launch.notify.close()


@pytest.mark.parametrize("name", LAUNCH_NAMES)
def test_artifact_command_serves_passes_its_health_check_and_exits_zero_on_sigterm(launched, name) -> None:
    launch = launched[name]
    cmd = shlex.join(launch.argv)
    assert launch.start_error is None, (
        f"{name}: `{cmd}` did not serve {launch.service}: {launch.start_error}\n{launch.log_tail()}"
    )
    before = launch.health_before
    assert before is not None and before.returncode == 0 and before.stdout.strip() == "SERVING", (
        name,
        before,
    )
    assert launch.exit_code == 0, f"{name}: `{cmd}` exited {launch.exit_code} on SIGTERM\n{launch.log_tail()}"
    assert launch.status_after == "UNREACHABLE", (name, launch.status_after)
    if launch.service == "trainer":  # stopped mid-job: after its first step, with the explorer running
        assert launch.steps is not None and launch.steps >= 1, (
            f"{name}: no training step\n{launch.log_tail()}"
        )
    if name.startswith("compose:"):  # the healthcheck command itself fails once the server is gone
        after = launch.health_after
        assert after is not None and after.returncode == 1 and after.stdout.strip() == "UNREACHABLE", (
            name,
            after,
        )


# What each service exports (docs/metrics.md), on top of the RPC and process series of every service.
OWN_FAMILIES = {
    "buffer": {"trinity_buffer_depth", "trinity_buffer_leases_outstanding", "trinity_buffer_rows"},
    "synchronizer": {"trinity_sync_latest_version", "trinity_sync_version_lag", "trinity_sync_members"},
    "trainer": {"trinity_trainer_step_seconds", "trinity_trainer_tokens_per_second", "trinity_trainer_step"},
    "explorer": {"trinity_explorer_weight_sync_seconds", "trinity_explorer_step_seconds"},
}
COMMON_FAMILIES = {
    "grpc_server_started",
    "grpc_server_handled",
    "grpc_server_handling_seconds",
    "process_resident_memory_bytes",
    "trinity_service_info",
}


@pytest.mark.parametrize("name", LAUNCH_NAMES)
def test_artifact_config_serves_prometheus_metrics_of_the_running_service(launched, name) -> None:
    launch = launched[name]
    assert launch.start_error is None, launch.log_tail()
    assert launch.metrics is not None, launch.metrics_error or f"{name}: its config sets no metrics_port"
    page = samples(launch.metrics)  # prometheus_client's parser: fails on a malformed page
    assert COMMON_FAMILIES | OWN_FAMILIES[launch.service] <= families(launch.metrics), name
    assert value(page, "trinity_service_info", service=launch.service, version="0.1.0") == 1
    assert value(page, "process_resident_memory_bytes") > 10 * 2**20
    if name.startswith("k8s:"):  # buffer and synchronizer alone: nothing called them but probes
        return
    # A whole (short) run went through: each figure moved.
    if launch.service == "buffer":
        read = {"grpc_service": "trinity_grpc.buffer.v1.BufferService", "grpc_method": "Read"}
        assert value(page, "grpc_server_handled_total", **read, grpc_type="unary", grpc_code="OK") >= 1
        written = [
            v
            for (n, labels), v in page.items()
            if n == "trinity_buffer_rows_total" and ("event", "written") in labels
        ]
        assert sum(written) >= 1, name
    elif launch.service == "synchronizer":
        assert value(page, "trinity_sync_members", role="trainer", state="alive") == 1
        assert value(page, "trinity_sync_members", role="explorer", state="alive") == 1
    elif launch.service == "trainer":
        assert value(page, "trinity_trainer_step") >= 1
        assert value(page, "trinity_trainer_step_seconds_count") >= 1
        assert value(page, "trinity_trainer_tokens_per_second") > 0
    else:
        assert value(page, "trinity_explorer_step") >= 1
        assert value(page, "trinity_explorer_weight_sync_seconds_count") >= 1


@pytest.mark.parametrize("service", RUNNABLE + WORKERS)
def test_systemd_started_service_sends_ready_to_notify_socket(launched, service) -> None:
    """trinity-grpc@.service is Type=notify: without READY=1 systemd fails the start after TimeoutStartSec."""
    assert ("Service", "Type", "notify") in read_unit(DEPLOY / "systemd" / "trinity-grpc@.service")
    launch = launched[f"systemd:{service}"]
    assert launch.start_error is None, launch.log_tail()
    assert any("READY=1" in message.splitlines() for message in launch.notified), (
        "the server sent no READY=1 to $NOTIFY_SOCKET: ServiceServer.start() must call "
        f"services.common.sdnotify.ready() once SERVING (deploy/systemd uses Type=notify); got {launch.notified}"
    )


def test_every_deploy_file_that_starts_a_service_says_how_in_a_comment() -> None:
    files = {f for f, _ in comment_commands()}
    for name in (
        "deploy/systemd/trinity-grpc@.service",
        "deploy/systemd/trainer-torchrun.conf.example",
        "deploy/compose/Dockerfile",
        "deploy/compose/compose.yaml",
        "deploy/compose/compose.gpu.yaml",
        "deploy/k8s/buffer.yaml",
        "deploy/k8s/synchronizer.yaml",
        "deploy/k8s/trainer.yaml",
        "deploy/k8s/explorer.yaml",
    ):
        assert name in files, f"{name} gives no `#   $ command` line"


def structured_commands(launched: dict[str, Launch]) -> dict[str, list[list[str]]]:
    """Per layout, the commands (in the artifact's own paths) the fixture ran."""
    out: dict[str, list[list[str]]] = {}
    for launch in launched.values():
        out.setdefault(launch.name.split(":")[0], []).append(launch.argv)
    return out


COMMENT_SERVES = [(f, argv) for f, argv in comment_commands() if served_service(argv) in RUNNABLE]


@pytest.mark.parametrize(
    ("source", "argv"), COMMENT_SERVES, ids=[f"{f}:{served_service(a)}" for f, a in COMMENT_SERVES]
)
def test_commented_serve_command_is_one_that_was_run(launched, source, argv) -> None:
    """A `$ trinity serve X ...` comment must be the very command the artifact runs (and the fixture ran)."""
    layout = source.split("/")[1]
    ran = structured_commands(launched)[layout]
    normalized = [pathlib.Path(argv[0]).name, *argv[1:]]
    assert normalized in [[pathlib.Path(r[0]).name, *r[1:]] for r in ran], (
        f"{source}: the comment's `{shlex.join(argv)}` differs from every command the {layout} layout runs: {ran}"
    )


COMMENT_HEALTH = [(f, argv) for f, argv in comment_commands() if health_address(argv)]


@pytest.mark.parametrize(
    ("source", "argv"), COMMENT_HEALTH, ids=[f"{f}:{health_address(a)}" for f, a in COMMENT_HEALTH]
)
def test_commented_health_command_probes_a_port_of_the_layout_config(source, argv) -> None:
    address = health_address(argv)
    assert address is not None
    host, _, port = address.rpartition(":")
    assert host == "127.0.0.1" and int(port) in DEFAULT_PORTS.values(), (source, argv)
    layout = source.split("/")[1]
    config = {
        "systemd": lambda: (DEPLOY / "systemd" / "config.yaml").read_text(),
        "compose": lambda: (DEPLOY / "compose" / "config.yaml").read_text(),
        "k8s": lambda: next(d for d in k8s_docs() if d["kind"] == "ConfigMap")["data"]["config.yaml"],
    }[layout]()
    ports = {v["port"] for k, v in yaml.safe_load(config)["services"].items() if k in DEFAULT_PORTS}
    assert int(port) in ports, (source, argv, ports)


OTHER_COMMANDS = [
    (f, argv)
    for f, argv in comment_commands()
    if pathlib.Path(argv[0]).name in ("trinity", "torchrun") and served_service(argv) not in RUNNABLE
]


@pytest.mark.parametrize(
    ("source", "argv"), OTHER_COMMANDS, ids=[f"{f}:{shlex.join(a)[:60]}" for f, a in OTHER_COMMANDS]
)
def test_commented_trainer_explorer_and_tool_commands_parse(source, argv) -> None:
    """Commands not run here (torch, GPUs) must at least be valid `trinity` / torchrun command lines."""
    from services.cli.main import build_parser

    if pathlib.Path(argv[0]).name == "torchrun":
        assert argv[argv.index("-m") + 1] == "services.trainer", argv
        assert argv[argv.index("--config") + 1] == "/etc/trinity-grpc/config.yaml", argv
        nproc = next(a.split("=", 1)[1] for a in argv if a.startswith("--nproc-per-node="))
        assert int(nproc) >= 1
        return
    args = build_parser().parse_args(argv[1:])
    if args.command == "serve":
        assert args.service in SERVICES and args.config == "/etc/trinity-grpc/config.yaml", argv
