"""The unit tests mirror the package tree, so the test of a module is one hop away:
services/<pkg>/<module>.py is tested under tests/unit/<pkg>/ (test_<module>.py where one module has its
own file), and a folder of the repository that is not a package (deploy/, examples/, docs/,
benchmarks/) or a package of its tools (scripts/) under tests/unit/<folder>/. Shared fakes live in
tests/fakes/."""

from __future__ import annotations

from tests.conftest import REPO

UNIT = REPO / "tests" / "unit"
REPO_FOLDERS = {"deploy", "examples", "docs", "benchmarks", "scripts"}


def test_no_unit_test_sits_outside_the_mirrored_tree() -> None:
    assert sorted(p.name for p in UNIT.glob("test_*.py")) == []


def test_every_unit_test_folder_mirrors_a_package_or_a_repo_folder() -> None:
    strays = []
    for folder in sorted(p for p in UNIT.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        rel = folder.relative_to(UNIT)
        if rel.parts[0] in REPO_FOLDERS:
            continue
        if rel.parts[-1] == "agentscope" and (REPO / "services" / rel.parent / "agentscope.py").exists():
            continue  # the AgentScope adapters' checks (services/explorer/workflows/agentscope*.py)
        if not (REPO / "services" / rel).is_dir():
            strays.append(str(rel))
        if not (folder / "__init__.py").exists():
            strays.append(f"{rel} (no __init__.py: test modules of the same name would collide)")
    assert strays == []
