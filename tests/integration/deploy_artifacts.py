"""What the deploy artifacts say to run, read out of them (tests/integration/test_deploy_commands.py):
systemd units and their EnvironmentFile, compose services and the Dockerfile's ENTRYPOINT,
Kubernetes containers, and the `$ ...` commands in the files' comments; each made a Launch in a
sandbox of its layout."""

from __future__ import annotations

import pathlib
import re
import shlex
import socket
import uuid

import yaml

from tests.integration.deploy_launch import (
    DEFAULT_PORTS,
    DEPLOY,
    REPO,
    RUNNABLE,
    STACK_OVERRIDES,
    WORKERS,
    Launch,
    Sandbox,
)

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
