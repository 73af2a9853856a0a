"""Every example config under examples/ loads, names real workflows and reward fns, and the data
preparation scripts of the GPU examples produce tasksets those configs read and rewards can score."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
from types import ModuleType

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.buffer.taskfile import load_rows
from services.common.config import TrinityConfig, load_config
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.workflows import WORKFLOWS
from tests.conftest import REPO

EXAMPLES = sorted(p for p in (REPO / "examples").rglob("*") if p.suffix in (".yaml", ".yml"))
# ${oc.env:VAR} with no default after a comma: the test must set VAR or the file cannot load
_REQUIRED_ENV = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)\}")


def _load_example(
    path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> TrinityConfig:
    for var in sorted(set(_REQUIRED_ENV.findall(path.read_text()))):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    return load_config(path)


def test_examples_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in EXAMPLES}
    assert {"examples/gsm8k_grpo/config.yaml", "examples/countdown_grpo/config.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_example_config_loads(
    path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    cfg = _load_example(path, monkeypatch, tmp_path)
    for stage in cfg.stage_configs:
        if (
            stage.explorer.plugin_dirs
        ):  # plugin workflows and rewards register only when the explorer loads them
            continue
        inputs = stage.buffer.explorer_input
        for taskset in [t for t in (inputs.taskset, *inputs.eval_tasksets) if t]:
            workflow = (
                taskset.default_workflow_type
                or inputs.default_workflow_type
                or stage.buffer.default_workflow_type
            )
            reward = (
                taskset.default_reward_fn_type
                or inputs.default_reward_fn_type
                or stage.buffer.default_reward_fn_type
            )
            if workflow:
                WORKFLOWS.get(workflow)
            if reward:
                REWARD_FUNCTIONS.get(reward)


def _module(path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{path.parent.name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,000 more than $234.", "answer": "1000 + 234 = 1234\n#### 1,234"},
]


def _write_parquet(path: pathlib.Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_gsm8k_prepared_taskset_is_what_the_config_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    raw, out = tmp_path / "raw", tmp_path / "gsm8k"
    _write_parquet(raw / "main" / "train-00000-of-00001.parquet", GSM8K_ROWS)  # the Hub's layout
    _write_parquet(raw / "main" / "test-00000-of-00001.parquet", GSM8K_ROWS[:1])
    _write_parquet(raw / "socratic" / "train-00000-of-00001.parquet", GSM8K_ROWS[:1])
    prep = _module(REPO / "examples" / "gsm8k_grpo" / "prepare_gsm8k.py")
    assert prep.main([str(raw), str(out)]) == 0

    monkeypatch.setenv("GSM8K_PATH", str(out))
    cfg = load_config(REPO / "examples" / "gsm8k_grpo" / "config.yaml")
    taskset = cfg.buffer.explorer_input.taskset
    assert taskset is not None and taskset.path == str(out)
    train = load_rows(taskset.path, split=taskset.split, subset_name=taskset.subset_name)
    test_set = cfg.buffer.explorer_input.eval_tasksets[0]
    assert len(load_rows(test_set.path or "", split=test_set.split)) == 1
    assert [r[taskset.format.response_key] for r in train] == ["7", "1234"]
    assert train[0][taskset.format.prompt_key] == GSM8K_ROWS[0]["question"]

    reward = REWARD_FUNCTIONS.get(taskset.default_reward_fn_type or "")
    right = reward(response="So the total is \\boxed{1,234}.", truth=train[1]["answer"])
    assert right == {"accuracy": 1.0, "format_score": -0.1}  # no <think>/<answer> layout: Trinity's -0.1
    assert reward(response="The answer is \\boxed{1235}.", truth=train[1]["answer"])["accuracy"] == 0.0


def test_gsm8k_prepare_rejects_rows_without_a_final_answer(tmp_path: pathlib.Path) -> None:
    prep = _module(REPO / "examples" / "gsm8k_grpo" / "prepare_gsm8k.py")
    with pytest.raises(ValueError, match="####"):
        prep.convert_row({"question": "q", "answer": "no marker here"})


def test_countdown_prepared_taskset_is_scored_by_countdown_reward(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    raw, out = tmp_path / "raw", tmp_path / "countdown"
    rows = [
        {"target": 22, "nums": [3, 5, 7]},
        {"target": 10, "nums": [2, 5, 1]},
        {"target": 4, "nums": [2, 2]},
    ]
    _write_parquet(raw / "data" / "train-00000-of-00001.parquet", rows)
    prep = _module(REPO / "examples" / "countdown_grpo" / "prepare_countdown.py")
    assert prep.main([str(raw), str(out), "--test-size", "1"]) == 0

    monkeypatch.setenv("COUNTDOWN_PATH", str(out))
    cfg = load_config(REPO / "examples" / "countdown_grpo" / "config.yaml")
    taskset = cfg.buffer.explorer_input.taskset
    assert taskset is not None
    train = load_rows(taskset.path or "", split="train")
    assert len(train) == 2 and len(load_rows(taskset.path or "", split="test")) == 1
    assert "[3, 5, 7]" in train[0]["question"] and "equals 22" in train[0]["question"]
    assert json.loads(train[0]["answer"]) == {"numbers": [3, 5, 7], "target": 22}

    reward = REWARD_FUNCTIONS.get(taskset.default_reward_fn_type or "")
    args = taskset.reward_fn_args
    truth = train[0][taskset.format.response_key]
    assert reward(response="<think>..</think><answer>(3 + 5) * 7 - 34</answer>", truth=truth, **args) == {
        "accuracy": 0.0,
        "format": 0.1,
    }  # uses 34, which is not one of the numbers
    assert reward(response="<answer>3 * 5 + 7</answer>", truth=truth, **args) == {
        "accuracy": 1.0,
        "format": 0.0,
    }

    with pytest.raises(ValueError, match="no training rows"):
        prep.prepare(str(raw), str(tmp_path / "x"), test_size=3)


def test_the_demo_example_is_the_embedded_default() -> None:
    packaged = REPO / "services" / "common" / "config" / "default.yaml"
    assert (REPO / "examples" / "demo" / "config.yaml").read_text() == packaged.read_text()
    cfg = load_config(packaged)
    assert [s.stage_name for s in cfg.stages] == ["sft", "grpo"]
    sft, grpo = cfg.stage_configs
    assert (sft.mode, sft.algorithm.algorithm_type, grpo.mode, grpo.algorithm.algorithm_type) == (
        "train",
        "sft",
        "both",
        "grpo",
    )
    assert grpo.buffer.explorer_input.eval_tasksets and grpo.synchronizer.sync_method == "checkpoint"
