"""The deploy artifacts pass the real validators: `systemd-analyze verify` and the Compose Specification.

No container engine, no systemd manager: `systemd-analyze verify` loads unit files offline (it wants
the ExecStart binaries to exist, so the units are rendered into a temp dir with /opt/trinity-grpc's
venv rewritten to this venv), and check-jsonschema ships the compose-spec schema. Each validator is
also shown a broken copy, so a validator that accepts anything fails here.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

from services.common.config.services import SERVICE_NAMES

REPO = pathlib.Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "deploy" / "systemd"
COMPOSE = REPO / "deploy" / "compose"
VENV_BIN = pathlib.Path(sys.executable).parent


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    assert path, (
        "systemd-analyze is not installed, so the systemd units cannot be verified; "
        "install it (Debian/Ubuntu: apt-get install systemd) — this test does not skip"
    )
    return path


def render_units(tmp: pathlib.Path, extra_dropins: dict[str, pathlib.Path] | None = None) -> pathlib.Path:
    """Copy deploy/systemd's units and drop-ins into tmp, ExecStart pointing at this venv."""
    units = tmp / "units"
    units.mkdir()
    for path in SYSTEMD.iterdir():
        if path.is_dir() and path.name.endswith(".service.d"):
            shutil.copytree(path, units / path.name)
        elif path.suffix in (".service", ".target"):
            shutil.copy(path, units / path.name)
    for target, source in (extra_dropins or {}).items():
        (units / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, units / target)
    for path in units.rglob("*"):
        if path.is_file():
            path.write_text(path.read_text().replace("/opt/trinity-grpc/.venv/bin/", f"{VENV_BIN}/"))
    return units


def verify(units: pathlib.Path, *names: str) -> subprocess.CompletedProcess[str]:
    env = {"SYSTEMD_UNIT_PATH": f"{units}:", "PATH": "/usr/bin:/bin", "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run(
        [systemd_analyze(), "verify", *(str(units / n) for n in names)],
        capture_output=True,
        text=True,
        env=env,
        cwd=units,
        timeout=60,
    )


def our_warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    """systemd-analyze exits 0 on unknown keys and bad values; its warnings name the file."""
    return [line for line in (result.stdout + result.stderr).splitlines() if "trinity-grpc" in line]


def test_systemd_units_verify_for_every_instance_and_the_target(tmp_path) -> None:
    units = render_units(tmp_path)
    names = [f"trinity-grpc@{service}.service" for service in SERVICE_NAMES] + ["trinity-grpc.target"]
    result = verify(units, *names)
    assert result.returncode == 0 and not our_warnings(result), result.stdout + result.stderr


def test_systemd_trainer_torchrun_dropin_verifies(tmp_path) -> None:
    dropin = {"trinity-grpc@trainer.service.d/20-torchrun.conf": SYSTEMD / "trainer-torchrun.conf.example"}
    units = render_units(tmp_path, dropin)
    result = verify(units, "trinity-grpc@trainer.service")
    assert result.returncode == 0 and not our_warnings(result), result.stdout + result.stderr


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("Type=notify", "Type=notifyy", "Failed to parse service type"),
        ("Restart=on-failure", "Restrat=on-failure", "Unknown key"),
        (f"{VENV_BIN}/trinity serve", "/nonexistent/trinity serve", "is not executable"),
    ],
    ids=["bad-value", "unknown-key", "missing-binary"],
)
def test_systemd_verification_catches_a_broken_unit(tmp_path, old, new, expect) -> None:
    units = render_units(tmp_path)
    template = units / "trinity-grpc@.service"
    text = template.read_text()
    assert old in text
    template.write_text(text.replace(old, new))
    result = verify(units, "trinity-grpc@buffer.service")
    assert result.returncode != 0 or our_warnings(result)
    assert expect in result.stdout + result.stderr


def venv_tool(name: str, *args: str | pathlib.Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a validator the dev extra installs into this venv (check-jsonschema, kubernetes-validate)."""
    tool = VENV_BIN / name
    assert tool.exists(), f"{tool} missing: pip install {name} (the dev extra)"
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def check_compose(*files: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return venv_tool("check-jsonschema", "--builtin-schema", "vendor.compose-spec", *files)


def test_compose_files_pass_the_compose_specification_schema() -> None:
    result = check_compose(
        COMPOSE / "compose.yaml", COMPOSE / "compose.gpu.yaml", COMPOSE / "compose.monitoring.yaml"
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_schema_check_catches_a_broken_file(tmp_path) -> None:
    text = (COMPOSE / "compose.yaml").read_text()
    broken = tmp_path / "compose.yaml"
    broken.write_text(text.replace("condition: service_healthy", "condition: service_ready", 1))
    result = check_compose(broken)
    assert result.returncode == 1 and "service_ready" in result.stdout, result.stdout + result.stderr


K8S = REPO / "deploy" / "k8s"


def kubernetes_validate(*files: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """kubernetes-validate (upstream Kubernetes OpenAPI schemas, bundled: works offline), strict mode."""
    return venv_tool("kubernetes-validate", "--strict", "--no-warn", *files)


def test_k8s_manifests_pass_kubernetes_validate_strict() -> None:
    resources = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    result = kubernetes_validate(*(K8S / name for name in resources))
    assert result.returncode == 0, result.stdout + result.stderr
    passed = [line for line in result.stdout.splitlines() if " passed for resource " in line]
    documents = sum(1 for name in resources for d in yaml.safe_load_all((K8S / name).read_text()) if d)
    assert len(passed) == documents, result.stdout


def test_kubernetes_validate_catches_a_broken_manifest(tmp_path) -> None:
    broken = tmp_path / "buffer.yaml"
    broken.write_text((K8S / "buffer.yaml").read_text().replace("serviceName:", "serviceNam:", 1))
    result = kubernetes_validate(broken)
    assert result.returncode == 1 and "'serviceNam' was unexpected" in result.stdout, (
        result.stdout + result.stderr
    )
