"""docs/metrics.md names every metric family the services export, and nothing they do not."""

from __future__ import annotations

import re

from services.explorer.metrics import STEP_METRICS as EXPLORER_STEPS
from services.trainer.metrics import STEP_METRICS as TRAINER_STEPS
from tests.conftest import REPO

PAGE = (REPO / "docs" / "metrics.md").read_text()
MODULES = ["common", "buffer", "synchronizer", "trainer", "explorer"]


def exported() -> set[str]:
    """Every `trinity_*` family name registered in services/*/metrics.py (counters as exposed: `_total`)."""
    names = set()
    for module in MODULES:
        source = (REPO / "services" / module / "metrics.py").read_text()
        counters = set(re.findall(r'read_counters\(\s*"(trinity_\w+)"', source))
        for name in re.findall(r'"(trinity_\w+)"', source):
            names.add(f"{name}_total" if name in counters else name)
    return names


def test_every_exported_family_is_documented_and_every_documented_one_exported() -> None:
    names = exported()
    assert {"trinity_buffer_depth", "trinity_sync_version_lag", "trinity_trainer_step"} <= names
    documented = set(re.findall(r"`(trinity_\w+)`", PAGE))
    info = {"trinity_service_info"}  # Info("trinity_service") is exposed with the `_info` suffix
    assert documented == (names - {"trinity_service"}) | info


def test_the_step_figures_name_the_step_metric_they_come_from() -> None:
    for spec in TRAINER_STEPS + EXPLORER_STEPS:
        row = next(line for line in PAGE.splitlines() if line.startswith(f"| `{spec.name}` |"))
        assert f"`{spec.key}`" in row and ("histogram" in row) == spec.histogram, row
