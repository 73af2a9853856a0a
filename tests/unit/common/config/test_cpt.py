"""algorithm_type cpt's config: its preset, what it runs with (mode train on a file of text rows, a
stage of a longer run), and every setting it cannot run with refused naming the keys, all at once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli.config_check import check_file
from services.common.config import validate_config
from services.common.config.algorithm import AlgorithmConfig
from services.common.errors import ConfigError

DOCS = {"name": "docs", "storage_type": "file", "path": "docs.jsonl"}


def cpt(mode: str = "train", **experience_buffer: Any) -> dict[str, Any]:
    return {
        "mode": mode,
        "algorithm": {"algorithm_type": "cpt"},
        "buffer": {
            "train_batch_size": 4,
            "trainer_input": {"experience_buffer": {**DOCS, **experience_buffer}},
        },
    }


def test_the_preset_is_sfts_loss_with_no_advantage_kl_or_entropy() -> None:
    algorithm = AlgorithmConfig(algorithm_type="cpt")
    parts = {
        key: algorithm.part(key) for key in ("advantage_fn", "policy_loss_fn", "kl_loss_fn", "kl_penalty_fn")
    }
    assert parts == {
        "advantage_fn": "none",
        "policy_loss_fn": "sft",
        "kl_loss_fn": "none",
        "kl_penalty_fn": "none",
    }
    assert algorithm.part("entropy_loss_fn") == "none" and algorithm.repeat_times == 1
    assert not algorithm.use_critic


def test_mode_train_on_a_file_of_text_rows() -> None:
    cfg = validate_config(cpt(format={"text_key": "content"}))
    storage = cfg.buffer.trainer_input.experience_buffer
    assert (cfg.algorithm.algorithm_type, storage.format.text_key) == ("cpt", "content")
    assert validate_config(cpt()).buffer.trainer_input.experience_buffer.format.text_key == "text"  # default
    assert (
        validate_config(cpt("bench", storage_type="queue", path=None)).mode == "bench"
    )  # scores checkpoints


def test_a_cpt_stage_before_rl_stages() -> None:
    tree = {
        "algorithm": {"algorithm_type": "grpo"},
        "buffer": {"explorer_input": {"taskset": {"name": "tasks", "path": "tasks.jsonl"}}},
        "stages": [
            {
                "stage_name": "cpt",
                "mode": "train",
                "algorithm": {"algorithm_type": "cpt"},
                "buffer": {"train_batch_size": 4, "trainer_input": {"experience_buffer": DOCS}},
            },
            {"stage_name": "grpo"},
        ],
    }
    first, second = validate_config(tree).stage_configs
    assert (first.algorithm.algorithm_type, first.algorithm.policy_loss_fn) == ("cpt", "sft")
    assert (second.mode, second.algorithm.algorithm_type) == ("both", "grpo")


@pytest.mark.parametrize("mode", ["both", "explore", "colocate", "serve"])
def test_modes_that_explore_are_refused(mode: str) -> None:
    tree = cpt(mode)
    if mode == "serve":  # a serve config that is otherwise fine
        tree["synchronizer"] = {"sync_method": "checkpoint", "sync_style": "dynamic_by_trainer"}
    with pytest.raises(
        ConfigError, match=f"algorithm.algorithm_type cpt with mode {mode}: .* use mode train"
    ) as err:
        validate_config(tree)
    assert err.value.field == "algorithm.algorithm_type"


@pytest.mark.parametrize(
    ("buffer", "got"),
    [
        ({"storage_type": "queue"}, "storage_type 'queue' and path 'docs.jsonl'"),
        ({"path": None}, "storage_type 'file' and path None"),
        ({"storage_type": "sql", "path": None}, "storage_type 'sql' and path None"),
    ],
)
def test_mode_train_needs_a_file_with_a_path(buffer: dict[str, Any], got: str) -> None:
    wanted = "needs buffer.trainer_input.experience_buffer.storage_type file and buffer.trainer_input.experience_buffer.path"
    with pytest.raises(ConfigError, match=re.escape(wanted)) as err:
        validate_config(cpt(**buffer))
    assert got in str(err.value)


def test_messages_rows_and_a_schema_type_are_refused() -> None:
    with pytest.raises(
        ConfigError, match="cpt reads plain text rows .*text_key 'text'.*prompt_type messages"
    ):
        validate_config(cpt(format={"prompt_type": "messages"}))
    for schema in ("sft", "dpo"):
        with pytest.raises(ConfigError, match=f"cpt with .*schema_type '{schema}': cpt rows are text rows"):
            validate_config(cpt(schema_type=schema))


def test_config_check_reports_every_problem_each_naming_its_key(tmp_path: Path) -> None:
    path = tmp_path / "cpt.yaml"
    tree = cpt("both", storage_type="queue", format={"prompt_type": "messages"}, schema_type="sft")
    path.write_text(yaml.safe_dump(tree))
    cfg, report = check_file(str(path), [])
    assert cfg is None
    cpt_lines = [p for p in report.problems if p.startswith("algorithm.algorithm_type cpt")]
    assert len(cpt_lines) == 3, report.problems  # mode, messages rows, schema_type (storage: train only)
    for line, says in zip(
        cpt_lines, ["with mode both", "not chat messages", "schema_type 'sft'"], strict=True
    ):
        assert says in line
