"""The 55 example configs of Trinity-RFT v0.5.2 (tests/data/trinity-v0.5.2-examples), unchanged,
through `trinity config check`: the tally of what loads and what stops the rest, printed (-s) and
recorded in docs/config.md.

Each config's environment variables point at a local stand-in directory. A config's problems are
sorted into kinds: an unknown key (a Trinity key with no meaning here yet), a rejected value (a key
we know whose value this project refuses, with the reason), a missing part (an algorithm, workflow,
reward fn, operator or package this project does not have), or a missing file (data sets and
models the examples name, which these machines do not have).
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest

from scripts.trinity_compat_doc import kind_of
from services.cli.config_check import check_file
from services.common.config.trinity_keys import meaning_of
from tests.conftest import REPO

EXAMPLES = REPO / "tests" / "data" / "trinity-v0.5.2-examples"
CONFIGS = sorted(p for p in EXAMPLES.rglob("*.yaml"))
DATA_JUICER_RECIPE = "grpo_gsm8k_experience_pipeline/dj_scoring_exp.yaml"
# Configs that load with every key understood (their problems, if any, are missing parts or files).
# A ratchet: raise it when a change makes more of them load; it must never drop.
MIN_KEYS_UNDERSTOOD = 54
# Configs whose only problems are what these machines lack (data, models, packages, parts): 35, then
# 43 once 9 of the 10 with trainer.ulysses_sequence_parallel_size 2 loaded (mix_vlm stays refused for
# its images), then more once model.enable_prompt_truncation: false and model.external_model (bench)
# worked. A ratchet too.
MIN_ONLY_WHAT_IS_MISSING_HERE = 44
# Parts the examples name that this project now has (18 taskset lookups missed them before): they
# must not come back as missing.
NOW_REGISTERED = {
    "reward function math_boxed_reward",
    "reward function math_dapo_reward",
    "workflow math_boxed_workflow",
}


@pytest.fixture(autouse=True)
def stand_in_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = set()
    for path in CONFIGS:
        names |= set(re.findall(r"oc\.env:([A-Z_0-9]+)", path.read_text()))
    for name in names:
        monkeypatch.setenv(name, str(tmp_path / name.lower()))


def test_the_55_configs_are_all_here() -> None:
    assert len(CONFIGS) == 55


def test_tally_of_trinity_v052_examples(capsys: pytest.CaptureFixture[str]) -> None:
    by_config: dict[str, set[str]] = {}
    keys: collections.Counter[str] = collections.Counter()
    parts: collections.Counter[str] = collections.Counter()
    for path in CONFIGS:
        rel = str(path.relative_to(EXAMPLES))
        _cfg, report = check_file(str(path), [])  # must never raise: every outcome is a report
        kinds = {kind_of(p) for p in report.problems}
        by_config[rel] = kinds
        for problem in report.problems:
            missing = re.search(r"unknown (\w+(?: \w+)?) '([^']+)'", problem)
            if missing and kind_of(problem) == "missing part":
                parts[f"{missing.group(1)} {missing.group(2)}"] += 1
            elif imported := re.search(r"cannot import workflow '(examples\.[\w.]+)'", problem):
                parts[f"workflow {imported.group(1).rsplit('.', 1)[-1]} (Trinity's examples/)"] += 1
            elif package := re.search(r"needs the (?:Python package '([\w.-]+)'|(\w+) package)", problem):
                parts[f"package {package.group(1) or package.group(2)}"] += 1
            match = re.match(r"(\S+): unknown key", problem)
            if match and rel != DATA_JUICER_RECIPE:
                keys[re.sub(r"\[\d+\]", "[*]", match.group(1))] += 1
    trinity = {k: v for k, v in by_config.items() if k != DATA_JUICER_RECIPE}
    clean = [k for k, v in trinity.items() if not v]
    understood = [k for k, v in trinity.items() if "unknown key" not in v]
    only_env = [k for k, v in trinity.items() if v and v <= {"missing file", "missing part"}]
    only_files = [k for k, v in trinity.items() if v == {"missing file"}]
    rejected = [k for k, v in trinity.items() if "rejected value" in v and "unknown key" not in v]
    with capsys.disabled():
        print(f"\nTrinity v0.5.2 examples: {len(trinity)} configs (+1 Data-Juicer recipe)")
        print(f"  every key understood:                 {len(understood)}")
        print(f"    check passes as is:                 {len(clean)}")
        print(f"    only missing data/models/parts:     {len(only_env)}")
        print(f"      of which only data/model files:   {len(only_files)}")
        for part, count in parts.most_common():
            print(f"        {count:3d}  missing {part}")
        print(f"    a value rejected (reason given):    {len(rejected)}")
        print(f"  stopped by an unknown key:            {len(trinity) - len(understood)}")
        for key, count in keys.most_common():
            print(f"    {count:3d}  {key}")
    assert "unknown key" in by_config[DATA_JUICER_RECIPE]  # not a Trinity config: its keys are named
    unlisted = sorted(key for key in keys if meaning_of(key) is None)
    assert not unlisted, f"Trinity keys with no entry in services/common/config/trinity_keys.py: {unlisted}"
    assert len(understood) >= MIN_KEYS_UNDERSTOOD, sorted(set(trinity) - set(understood))
    assert len(clean) + len(only_env) >= MIN_ONLY_WHAT_IS_MISSING_HERE, sorted(rejected)
    assert not set(parts) & NOW_REGISTERED, sorted(set(parts) & NOW_REGISTERED)


def test_grpo_gsm8k_names_only_what_is_missing_here() -> None:
    _cfg, report = check_file(str(EXAMPLES / "grpo_gsm8k" / "gsm8k.yaml"), [])
    assert report.problems, "the gsm8k data set and Qwen model are not on this machine"
    assert {kind_of(p) for p in report.problems} <= {"missing file", "missing part"}, report.problems
