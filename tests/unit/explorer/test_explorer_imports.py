"""The explorer never imports the trainer: the RL math both need lives in services/algorithms.

An explorer that imported `services.trainer` would load the trainer's whole algorithm library (and
whatever that grows to import) at start-up, and the two services could no longer ship apart.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys

import services

SERVICES = pathlib.Path(services.__file__).parent
EXPLORER = SERVICES / "explorer"
TRAINER = re.compile(r"^services\.trainer(\.|:|$)")

# The modules an explorer process imports before it runs: `python -m services.explorer` (entry.py
# imports services.explorer.server), and what server.serve imports inside the function.
ENTRY_MODULES = [
    "services.explorer.__main__",
    "services.explorer.server",
    "services.explorer.build",
    "services.explorer.explorer",
    "services.explorer.runner",
    "services.explorer.weight_sync",
    "services.explorer.plugins",
]


def trainer_references(path: pathlib.Path) -> list[str]:
    """`line: name` for every import of services.trainer in `path` (at any level, in any function)
    and every string naming a services.trainer module (a dotted path imported later)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        found += [f"{node.lineno}: {name}" for name in names if TRAINER.match(name)]
    return found


def test_no_explorer_module_imports_the_trainer():
    offenders = {
        str(path.relative_to(SERVICES.parent)): refs
        for path in sorted(EXPLORER.rglob("*.py"))
        if (refs := trainer_references(path))
    }
    assert offenders == {}, f"the explorer imports services.trainer (use services.algorithms): {offenders}"


def test_the_reference_finder_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import services.trainer\n"
        "def f():\n    from services.trainer.algorithms import parts\n"
        "PATH = 'services.trainer.algorithms.kl:kl_k1'\n"
        "from services.algorithms.advantage import ADVANTAGE_FN\n"
    )
    assert sorted(trainer_references(module)) == [
        "1: services.trainer",
        "3: services.trainer.algorithms",
        "3: services.trainer.algorithms.parts",
        "4: services.trainer.algorithms.kl:kl_k1",
    ]


def test_explorer_start_up_loads_no_trainer_module():
    code = (
        "import importlib, json, sys\n"
        f"for name in {ENTRY_MODULES!r}:\n    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[:2] == ['services', 'trainer'])))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=SERVICES.parent
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
