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
than ending by itself; SIGTERM comes once each trainer has trained at least one step.

Checked for shape only: Kubernetes' trainer and explorer (the trainer is a two-node torchrun,
`--nnodes=2 --master-addr=trinity-trainer-0...`, not reproducible on one machine without rewriting the
command), and the single-node torchrun lines (systemd drop-in example, compose.gpu.yaml). Those would
run on CPU with `--nproc-per-node=1`, but only as a second trainer after the first has stopped (~10 s
more of torch start-up on a 2-core machine), and tests/integration/test_trainer_fsdp.py already runs
the same `torchrun ... -m services.trainer --config F` with two CPU ranks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import yaml

from services.common.config.services import ServicesConfig
from services.common.errors import TrinityError
from services.common.health import check_health, wait_healthy
from services.common.procs import free_port, stop_process

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VENV_BIN = pathlib.Path(sys.executable).parent
SERVICES = ("buffer", "synchronizer", "trainer", "explorer")
DEFAULT_PORTS = {"buffer": 50051, "synchronizer": 50052, "trainer": 50053, "explorer": 50054}
MAPPED_ROOTS = ("/etc/trinity-grpc", "/var/lib/trinity-grpc", "/var/cache/trinity-grpc")
RUNNABLE = ("buffer", "synchronizer")  # in every layout
WORKERS = ("trainer", "explorer")  # in the systemd and compose layouts, after RUNNABLE is healthy
# Long enough that trainer and explorer are mid-job when SIGTERM comes (4 tasks, batch 4: a step an epoch).
STACK_OVERRIDES = {"buffer": {"total_epochs": 1000}}


# --- a sandbox that stands in for the machine/container the artifact describes -------------------


class Sandbox:
    """Temp root for the artifact's absolute paths, plus the artifact's config with free ports."""

    def __init__(
        self, tmp: pathlib.Path, config_text: str, files: dict[str, str], overrides: dict | None = None
    ) -> None:
        self.root = tmp / "root"
        data = yaml.safe_load(config_text)
        for section, values in (overrides or {}).items():
            data.setdefault(section, {}).update(values)
        self.port_map: dict[int, int] = {}
        for name in SERVICES:
            endpoint = data.setdefault("services", {}).setdefault(name, {})
            old = int(endpoint.get("port", DEFAULT_PORTS[name]))
            self.port_map[old] = free_port()
            endpoint.update(host="127.0.0.1", bind=None, port=self.port_map[old])
        self.ports = {name: data["services"][name]["port"] for name in SERVICES}
        for path, text in files.items():
            self.write(path, text)
        self.config = self.write(
            "/etc/trinity-grpc/config.yaml", self.map_text(yaml.safe_dump(data, sort_keys=False))
        )
        self.config_data = data

    def write(self, path: str, text: str) -> pathlib.Path:
        target = pathlib.Path(self.map_text(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target

    def map_text(self, text: str) -> str:
        for root in MAPPED_ROOTS:
            text = text.replace(root, f"{self.root}{root}")
        return text.replace("/opt/trinity-grpc/.venv/bin/", f"{VENV_BIN}/")

    def map_port(self, address: str) -> str:
        host, _, port = address.rpartition(":")
        return f"{host}:{self.port_map.get(int(port), int(port))}"

    def argv(self, argv: list[str]) -> list[str]:
        out = [self.map_text(arg) for arg in argv]
        if out and "/" not in out[0] and (VENV_BIN / out[0]).exists():
            out[0] = str(VENV_BIN / out[0])
        return out

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {key: self.map_text(value) for key, value in env.items()}


@dataclasses.dataclass
class Launch:
    """One command of one artifact, run against its sandbox; the fields below the line are outcomes."""

    name: str
    service: str
    sandbox: Sandbox
    argv: list[str]
    env: dict[str, str]
    health_argv: list[str]
    log: pathlib.Path
    notify: socket.socket | None = None
    # ----
    proc: subprocess.Popen[bytes] | None = None
    start_error: str | None = None
    health_before: subprocess.CompletedProcess[str] | None = None
    exit_code: int | None = None
    status_after: str | None = None
    health_after: subprocess.CompletedProcess[str] | None = None
    notified: list[str] = dataclasses.field(default_factory=list)
    steps: int | None = None  # trainers: GetInfo's step when SIGTERM was sent

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sandbox.ports[self.service]}"

    def log_tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""


def run_health(launch: Launch) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **launch.env}
    return subprocess.run(
        launch.sandbox.argv(launch.health_argv), capture_output=True, text=True, env=env, timeout=30
    )


def start(launch: Launch) -> None:
    base_env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    env = {**base_env, "PYTHONUNBUFFERED": "1", **launch.env}
    with open(launch.log, "wb") as out:
        launch.proc = subprocess.Popen(
            launch.sandbox.argv(launch.argv),
            env=env,
            cwd=launch.sandbox.root,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def healthy(launch: Launch) -> None:
    proc = launch.proc
    assert proc is not None
    try:
        await wait_healthy(launch.address, 90, alive=lambda: proc.poll() is None)
    except (RuntimeError, TimeoutError) as exc:
        launch.start_error = str(exc)


async def wait_step(launch: Launch, timeout: float = 90) -> None:
    """Wait until the service's GetInfo says step ≥ 1 (a trainer step needs an explorer step's data)."""
    from services.cli.status import service_info

    proc = launch.proc
    assert proc is not None
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline and proc.poll() is None:
        try:
            info = await service_info(launch.service, launch.address, ServicesConfig(), 3)
            launch.steps = int(info.stats.get("step", 0))
            if launch.steps >= 1:
                return
        except TrinityError:
            pass
        await asyncio.sleep(0.5)


async def stop(launches: list[Launch]) -> None:
    for launch in launches:
        assert launch.proc is not None
        if launch.proc.poll() is None:
            launch.proc.send_signal(signal.SIGTERM)
    for launch in launches:
        assert launch.proc is not None
        try:
            launch.exit_code = await asyncio.to_thread(launch.proc.wait, 60)
        except subprocess.TimeoutExpired:
            stop_process(launch.proc, signal.SIGKILL, timeout=5)


async def exercise(launches: list[Launch]) -> None:
    """Start all, wait SERVING, run each artifact's health command, SIGTERM all, probe again.

    In two waves, as systemd's After= and compose's depends_on order them: buffers and synchronizers
    first, then trainers and explorers once those are SERVING; stopped the other way round (a trainer
    that stops flushes its leases to the buffer). Within a wave all at once: the machine is small and
    each start is mostly Python start-up time.
    """
    waves = [
        [la for la in launches if la.service not in WORKERS],
        [la for la in launches if la.service in WORKERS],
    ]
    for wave in waves:
        for launch in wave:
            start(launch)
        await asyncio.gather(*(healthy(launch) for launch in wave))
    serving = [launch for launch in launches if launch.start_error is None]
    results = await asyncio.gather(*(asyncio.to_thread(run_health, launch) for launch in serving))
    for launch, result in zip(serving, results, strict=True):
        launch.health_before = result
    # SIGTERM mid-job, not between jobs: each trainer has trained on its explorer's experiences.
    await asyncio.gather(*(wait_step(la) for la in serving if la.service == "trainer"))
    for wave in reversed(waves):
        await stop(wave)
    # Once stopped: the in-process probe for all, the artifact's own command where it is a supervisor's
    # healthcheck (compose) — a Python start-up each, and the machine is small.
    for launch in serving:
        launch.status_after = await check_health(launch.address, timeout=1)
    own = [launch for launch in serving if launch.name.startswith("compose:")]
    results = await asyncio.gather(*(asyncio.to_thread(run_health, launch) for launch in own))
    for launch, result in zip(own, results, strict=True):
        launch.health_after = result
    for launch in launches:
        while launch.notify is not None:
            try:
                launch.notified.append(launch.notify.recv(4096).decode())
            except BlockingIOError:
                break


# --- systemd ---------------------------------------------------------------------------------------


def read_unit(path: pathlib.Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of a unit file, in order (keys repeat)."""
    entries, section = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def read_env_file(path: pathlib.Path) -> dict[str, str]:
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip().strip('"')
    return env


def systemd_command(instance: str) -> tuple[list[str], dict[str, str]]:
    """ExecStart of trinity-grpc@<instance>.service with %i, EnvironmentFile= and Environment= applied."""
    unit = read_unit(DEPLOY / "systemd" / "trinity-grpc@.service")
    env: dict[str, str] = {}
    exec_start = None
    for section, key, value in unit:
        if section != "Service":
            continue
        value = value.replace("%i", instance)
        if key == "EnvironmentFile":
            path = value.lstrip("-")
            assert path.startswith("/etc/trinity-grpc/"), path
            local = DEPLOY / "systemd" / pathlib.Path(path).name
            if value.startswith("-") and not local.exists():
                continue
            env.update(read_env_file(local))
        elif key == "Environment":
            name, _, val = value.partition("=")
            env[name] = val
        elif key == "ExecStart":
            exec_start = value
    assert exec_start, "no ExecStart in trinity-grpc@.service"
    argv = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], arg) for arg in shlex.split(exec_start)]
    return argv, env


def systemd_sandbox(tmp_path: pathlib.Path, overrides: dict | None = None) -> Sandbox:
    return Sandbox(
        tmp_path,
        (DEPLOY / "systemd" / "config.yaml").read_text(),
        {"/var/lib/trinity-grpc/data/tasks.jsonl": (DEPLOY / "compose" / "data" / "tasks.jsonl").read_text()},
        overrides,
    )


def dockerfile_entrypoint() -> list[str]:
    for line in (DEPLOY / "compose" / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT "):
            return list(yaml.safe_load(line[len("ENTRYPOINT ") :]))
    raise AssertionError("Dockerfile has no ENTRYPOINT")


def compose_sandbox(tmp_path: pathlib.Path, overrides: dict | None = None) -> tuple[Sandbox, dict]:
    compose_dir = DEPLOY / "compose"
    compose = yaml.safe_load((compose_dir / "compose.yaml").read_text())
    files = {}
    for svc in compose["services"].values():  # bind mounts of files and directories from the repo
        for volume in svc.get("volumes", []):
            source, target = volume.split(":")[:2]
            local = compose_dir / source
            if source.startswith(".") and local.is_dir():
                files.update(
                    {
                        f"{target}/{p.relative_to(local)}": p.read_text()
                        for p in local.rglob("*")
                        if p.is_file()
                    }
                )
    return Sandbox(tmp_path, (compose_dir / "config.yaml").read_text(), files, overrides), compose


def k8s_docs() -> list[dict]:
    return [
        doc
        for f in sorted((DEPLOY / "k8s").glob("*.yaml"))
        for doc in yaml.safe_load_all(f.read_text())
        if doc
    ]


def k8s_sandbox(tmp_path: pathlib.Path) -> Sandbox:
    config_map = next(
        d for d in k8s_docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "trinity-config"
    )
    files = {
        f"/etc/trinity-grpc/{key}": text for key, text in config_map["data"].items() if key != "config.yaml"
    }
    return Sandbox(tmp_path, config_map["data"]["config.yaml"], files)


def k8s_container(component: str) -> tuple[dict, dict]:
    workload = next(
        d
        for d in k8s_docs()
        if d["kind"] in ("StatefulSet", "Deployment", "Job")
        and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == component
    )
    return workload, workload["spec"]["template"]["spec"]["containers"][0]


def k8s_env(container: dict, pod_name: str) -> dict[str, str]:
    """Container env as the kubelet would set it (fieldRefs get plausible values)."""
    field_values = {
        "metadata.name": pod_name,
        "metadata.namespace": "trinity-grpc",
        "status.podIP": "127.0.0.1",
    }
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = field_values[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def expand_k8s(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command/args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)


def comment_commands() -> list[tuple[str, list[str]]]:
    """(file, argv) of every `#   $ command` line under deploy/."""
    found = []
    for path in sorted(DEPLOY.rglob("*")):
        # deploy/compose/wheelhouse/ holds the wheels of offline image builds (`make image`), not commands
        if path.is_file() and path.suffix != ".json" and "wheelhouse" not in path.parts:
            for line in path.read_text().splitlines():
                match = re.match(r"^\s*#\s+\$ (.+)$", line)
                if match:
                    found.append((str(path.relative_to(REPO)), shlex.split(match.group(1))))
    return found


def served_service(argv: list[str]) -> str | None:
    if len(argv) >= 3 and argv[0].endswith("trinity") and argv[1] == "serve":
        return argv[2]
    return None


def health_address(argv: list[str]) -> str | None:
    if "--" in argv:  # kubectl exec POD -- trinity health ADDRESS
        argv = argv[argv.index("--") + 1 :]
    if len(argv) >= 3 and argv[0].endswith("trinity") and argv[1] == "health":
        return argv[2]
    return None


def notify_socket() -> tuple[socket.socket, str]:
    """A datagram socket in the abstract namespace, as systemd's $NOTIFY_SOCKET (no path-length limit)."""
    name = f"trinity-deploy-test-{uuid.uuid4().hex[:12]}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.setblocking(False)
    return sock, f"@{name}"


def systemd_launches(tmp: pathlib.Path) -> list[Launch]:
    """All four instances of trinity-grpc@.service against one machine's config."""
    out = []
    sandbox = systemd_sandbox(tmp / "systemd", STACK_OVERRIDES)
    for service in RUNNABLE + WORKERS:
        argv, env = systemd_command(service)
        assert argv[:3] == ["/opt/trinity-grpc/.venv/bin/trinity", "serve", service], argv
        sock, address = notify_socket()
        health = next(
            a for f, a in comment_commands() if f.endswith("trinity-grpc@.service") and health_address(a)
        )
        health = [*health[:2], sandbox.map_port(f"127.0.0.1:{DEFAULT_PORTS[service]}")]
        out.append(
            Launch(
                f"systemd:{service}",
                service,
                sandbox,
                argv,
                {**sandbox.env(env), "NOTIFY_SOCKET": address},
                health,
                tmp / f"systemd-{service}.log",
                notify=sock,
            )
        )
    return out


def compose_launches(tmp: pathlib.Path) -> list[Launch]:
    """All four compose services against one project's config."""
    out = []
    sandbox, compose = compose_sandbox(tmp / "compose", STACK_OVERRIDES)
    for service in RUNNABLE + WORKERS:
        spec = compose["services"][service]
        env = {k: str(v) for k, v in (spec.get("environment") or {}).items()}
        test = spec["healthcheck"]["test"]
        assert test[0] == "CMD", test
        health = [test[1], test[2], sandbox.map_port(test[3]), *test[4:]]
        out.append(
            Launch(
                f"compose:{service}",
                service,
                sandbox,
                dockerfile_entrypoint() + list(spec["command"]),
                sandbox.env(env),
                health,
                tmp / f"compose-{service}.log",
            )
        )
    return out


def k8s_launches(tmp: pathlib.Path) -> list[Launch]:
    out = []
    for component in RUNNABLE:
        sandbox = k8s_sandbox(tmp / f"k8s-{component}")
        workload, container = k8s_container(component)
        env = k8s_env(container, f"{workload['metadata']['name']}-0")
        argv = [expand_k8s(a, env) for a in container["command"] + container.get("args", [])]
        probe_port = container["readinessProbe"]["grpc"]["port"]
        health = ["trinity", "health", sandbox.map_port(f"127.0.0.1:{probe_port}")]
        out.append(
            Launch(
                f"k8s:{component}",
                component,
                sandbox,
                argv,
                sandbox.env(env),
                health,
                tmp / f"k8s-{component}.log",
            )
        )
    return out


LAUNCH_NAMES = [
    *(f"{layout}:{service}" for layout in ("systemd", "compose") for service in RUNNABLE + WORKERS),
    *(f"k8s:{service}" for service in RUNNABLE),
]


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
