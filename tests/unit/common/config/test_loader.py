"""Config loading: interpolation, strictness, errors that name the key path, stages."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from services.common.config import load_config
from services.common.errors import ConfigError
from tests.conftest import TRINITY


def write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_embedded_default_is_valid() -> None:
    cfg = load_config()
    assert cfg.mode == "both"
    assert cfg.run_dir.endswith(f"{cfg.project}/{cfg.name}")


def test_env_interpolation_with_default_and_override(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path,
        "project: p\ncheckpoint_root_dir: ${oc.env:TRINITY_TEST_ROOT,/tmp/default-root}\nname: ${project}-x\n",
    )
    monkeypatch.delenv("TRINITY_TEST_ROOT", raising=False)
    assert load_config(path).checkpoint_root_dir == "/tmp/default-root"
    monkeypatch.setenv("TRINITY_TEST_ROOT", "/srv/runs")
    cfg = load_config(path)
    assert cfg.checkpoint_root_dir == "/srv/runs"
    assert cfg.name == "p-x"


def test_scientific_notation_is_a_float(tmp_path: pathlib.Path) -> None:
    cfg = load_config(write(tmp_path, "algorithm:\n  optimizer:\n    lr: 3e-4\n"))
    assert cfg.algorithm.optimizer.lr == pytest.approx(3e-4)


def test_an_unnamed_experience_buffer_is_named_once_at_load(tmp_path: pathlib.Path) -> None:
    """Explorer, trainer, buffer specs and counters all read the resolved name: no second default."""
    text = "buffer:\n  trainer_input:\n    experience_buffer: {storage_type: sql}\n"
    assert (
        load_config(write(tmp_path, text)).buffer.trainer_input.experience_buffer.name == "experience_buffer"
    )
    named = text.replace("{storage_type: sql}", "{name: rows, storage_type: sql}")
    assert load_config(write(tmp_path, named)).buffer.trainer_input.experience_buffer.name == "rows"


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        ("buffer:\n  batchsize: 3\n", "buffer.batchsize", "unknown key"),
        ("synchronizer:\n  sync_interval: often\n", "synchronizer.sync_interval", "valid integer"),
        (
            "synchronizer:\n  sync_method: carrier_pigeon\n",
            "synchronizer.sync_method",
            "'nccl', 'checkpoint', 'memory', 'online' or 'offline'",
        ),
        (
            "explorer:\n  auxiliary_models:\n    - engine_num: 2\n",
            "explorer.auxiliary_models[0].model_path",
            "required",
        ),
        ("buffer:\n  batch_size: 0\n", "buffer.batch_size", "greater than or equal to 1"),
        ("stages:\n  - mode: train\n", "stages[0].stage_name", "required"),
    ],
)
def test_bad_config_names_the_key(tmp_path: pathlib.Path, text: str, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert info.value.field == path
    assert path in str(info.value) and fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "explorer:\n  auxiliary_models:\n    - engine_num: 2\n",
            "explorer.auxiliary_models[0].model_path: required value is missing (expected str: Hub id or local path.)",
        ),
        (
            "data_processor:\n  experience_pipeline:\n    operators:\n      - args: {}\n",
            "data_processor.experience_pipeline.operators[0].name: required value is missing (expected str: ",
        ),
        (
            "stages:\n  - mode: train\n",
            "stages[0].stage_name: required value is missing (expected str: Unique name",
        ),
    ],
)
def test_missing_value_names_the_expected_type(tmp_path: pathlib.Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("loc", "expected"),
    [
        (("synchronizer", "sync_method"), "(expected one of 'nccl', 'checkpoint'"),
        (("explorer", "rollout_model"), "(expected a mapping ("),
        (
            ("data_processor", "experience_pipeline", "operators"),
            "(expected a list of OperatorConfig",
        ),
        (("no_such_section", "x"), "required value is missing"),
    ],
)
def test_missing_value_message_names_allowed_values_and_sections(loc: tuple, expected: str) -> None:
    from services.common.config.loader import format_error

    line = format_error({"loc": loc, "type": "missing", "msg": "Field required"})
    assert line.startswith(".".join(loc) + ": required value is missing")
    assert expected in line


def test_unknown_key_lists_allowed_keys(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "trainer:\n  save_intervall: 3\n"))
    assert "save_interval" in str(info.value)


def test_stages_merge_over_globals_and_are_validated(tmp_path: pathlib.Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            "name: exp\nalgorithm:\n  algorithm_type: grpo\n  repeat_times: 4\n"
            "stages:\n  - stage_name: warmup\n    mode: train\n    algorithm:\n      algorithm_type: sft\n"
            "  - stage_name: rl\n",
        )
    )
    warmup, rl = cfg.stage_configs
    assert (warmup.name, warmup.mode, warmup.algorithm.algorithm_type) == ("exp/warmup", "train", "sft")
    assert warmup.algorithm.repeat_times == 4  # inherited
    assert (rl.name, rl.mode, rl.algorithm.algorithm_type) == ("exp/rl", "both", "grpo")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "stages:\n  - stage_name: a\n    buffer:\n      batch_size: -1\n"))
    assert info.value.field == "stages[0].buffer.batch_size"


def test_overrides_apply_as_dotlist(tmp_path: pathlib.Path) -> None:
    cfg = load_config(
        write(tmp_path, "buffer:\n  batch_size: 2\n"), ["buffer.batch_size=7", "services.buffer.port=6001"]
    )
    assert cfg.buffer.batch_size == 7 and cfg.services.buffer.port == 6001


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model:\n  max_prompt_tokens: lots\n", "model.max_prompt_tokens"),
        ("monitor:\n  monitor_type: wandbb\n", "monitor.monitor_type"),
        ("explorer:\n  rollout_model:\n    engin_type: vllm\n", "explorer.rollout_model.engin_type"),
        (
            "explorer:\n  auxiliary_models:\n    - engine_num: 2\n",
            "explorer.auxiliary_models[0].model_path: required value is missing (expected str",
        ),
    ],
)
def test_cli_config_check_exits_nonzero_naming_the_key(
    tmp_path: pathlib.Path, text: str, expected: str
) -> None:
    result = subprocess.run(
        [str(TRINITY), "config", "check", str(write(tmp_path, text))], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert expected in result.stderr


def test_cli_config_check_accepts_a_good_file(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [str(TRINITY), "config", "check", str(write(tmp_path, "mode: train\n"))],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_cli_config_check_takes_the_file_as_trinity_run_does(tmp_path: pathlib.Path) -> None:
    path = str(write(tmp_path, "mode: train\n"))
    flag = subprocess.run([str(TRINITY), "config", "check", "--config", path], capture_output=True, text=True)
    assert flag.returncode == 0 and "OK" in flag.stdout, flag.stderr
    both = subprocess.run(
        [str(TRINITY), "config", "check", path, "--config", path], capture_output=True, text=True
    )
    none = subprocess.run([str(TRINITY), "config", "check"], capture_output=True, text=True)
    for result in (both, none):
        assert result.returncode == 2 and "give the config file once" in result.stderr
