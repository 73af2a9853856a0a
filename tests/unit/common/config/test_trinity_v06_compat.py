"""Trinity v0.6's 35 example files (tests/data/trinity-v0.6-examples), unchanged, through `trinity config
check`: the tally of what is accepted, what fails only on what these machines lack (data sets,
models, packages, parts this project does not have) and what is refused with the reason, printed
(-s) and, for the loader's part, recorded in docs/config.md. Nothing is left not understood: every
problem names its key and says why.

An environment variable a config reads with a default keeps its default (the run Trinity's authors
describe); the others point at a local stand-in directory.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest

from scripts.trinity_compat_doc import EXAMPLES_V06, NOT_A_CONFIG_V06, example_configs, kind_of, stand_in_env
from services.cli.config_check import check_file

CONFIGS = example_configs(EXAMPLES_V06)
# Ratchets: raise them when a change makes more configs go through; they must never drop.
MIN_ONLY_WHAT_IS_MISSING_HERE = 15  # accepted, or failing only on data / models / packages / parts
KEY_FIRST = re.compile(r"^[A-Za-z_][\w.\[\]*]*[ :]+\S")  # a problem line starts with its key, then why


@pytest.fixture(autouse=True)
def example_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in stand_in_env(CONFIGS, str(tmp_path), keep_defaults=True).items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


def test_the_34_configs_and_the_workflow_arguments_file_are_here() -> None:
    assert len(CONFIGS) == 34 and len(list(EXAMPLES_V06.rglob("*.yaml"))) == 35
    _cfg, report = check_file(
        str(EXAMPLES_V06 / NOT_A_CONFIG_V06), []
    )  # not a run config: its keys are named
    assert sorted(p.split(":")[0] for p in report.problems) == ["default_workflow_type", "workflow_args"]


def test_tally_of_trinity_v06_examples(capsys: pytest.CaptureFixture[str]) -> None:
    kinds_of: dict[str, set[str]] = {}
    parts: collections.Counter[str] = collections.Counter()
    refused: collections.Counter[str] = collections.Counter()
    unnamed = []
    for path in CONFIGS:
        rel = str(path.relative_to(EXAMPLES_V06))
        _cfg, report = check_file(str(path), [])  # never raises: every outcome is a report
        kinds_of[rel] = {kind_of(p) for p in report.problems}
        unnamed += [f"{rel}: {p}" for p in report.problems if not KEY_FIRST.match(p)]
        for problem in report.problems:
            kind = kind_of(problem)
            key = re.sub(r"\[\d+\]", "[*]", re.sub(r"^stages\[\d+\]\.", "", re.split(r"[ :]", problem)[0]))
            if kind == "missing part" and (
                module := re.search(r"cannot import workflow '([\w.]+)'", problem)
            ):
                parts[f"workflow {module.group(1).rsplit('.', 1)[-1]} (Trinity's module)"] += 1
            elif kind == "missing part":
                what = re.search(
                    r"unknown (\w+(?: \w+)?) '([^']+)'|needs the (?:Python package '([\w.-]+)'|(\w+) package)",
                    problem,
                )
                parts[" ".join(g for g in (what.groups() if what else (key,)) if g)] += 1
            elif kind == "rejected value":
                refused[key] += 1
    accepted = [k for k, v in kinds_of.items() if not v]
    only_missing = [k for k, v in kinds_of.items() if v and v <= {"missing file", "missing part"}]
    only_files = [k for k, v in kinds_of.items() if v == {"missing file"}]
    with_reason = [k for k, v in kinds_of.items() if "rejected value" in v and "unknown key" not in v]
    not_understood = [k for k, v in kinds_of.items() if "unknown key" in v]
    with capsys.disabled():
        print(f"\nTrinity v0.6 examples: {len(CONFIGS)} configs (+1 workflow-arguments file)")
        print(f"  accepted as they are:                  {len(accepted)}")
        print(f"  failing only on what is missing here:  {len(only_missing)}")
        print(f"    of which only data/model files:      {len(only_files)}")
        for part, count in parts.most_common():
            print(f"      {count:3d}  missing {part}")
        print(f"  refused with the reason:               {len(with_reason)}")
        for key, count in refused.most_common():
            print(f"      {count:3d}  {key}")
        print(f"  not understood (a key with no meaning): {len(not_understood)}")
    assert not not_understood, not_understood
    assert not unnamed, unnamed  # every refusal names its key and says why
    assert len(accepted) + len(only_missing) >= MIN_ONLY_WHAT_IS_MISSING_HERE


def test_rollout_model_enable_thinking_false_is_understood_in_the_research_configs() -> None:
    """The CoD configs set explorer.rollout_model.enable_thinking: false, refused as "unset only" before."""
    with_it = [p for p in CONFIGS if re.search(r"(?m)^    enable_thinking: false", p.read_text())]
    assert len(with_it) == 14 and all("research_cod" in str(p) for p in with_it)
    for path in with_it:
        _cfg, report = check_file(str(path), [])
        assert not [p for p in report.problems if "enable_thinking" in p], (path, report.problems)
