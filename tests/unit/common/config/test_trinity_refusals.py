"""Trinity v0.5.2 keys this project refuses with the reason (multi-modal rows, Tinker, the
Data-Juicer service) and the experience pipeline's save_input path check: each refusal names the
key, and the value that means "not used" is accepted."""

from __future__ import annotations

import pytest

from services.common.config import validate_config
from services.common.errors import ConfigError


def _taskset(**fmt: object) -> dict[str, object]:
    return {"buffer": {"explorer_input": {"taskset": {"name": "t", "path": "t.jsonl", "format": fmt}}}}


@pytest.mark.parametrize("key", ["image_key", "video_key"])
def test_multi_modal_rows_are_refused(key: str) -> None:
    validate_config(_taskset(prompt_key="q"))
    with pytest.raises(ConfigError, match=f"format.{key} 'images': multi-modal rows are not supported"):
        validate_config(_taskset(**{key: "images"}))


def test_tinker_enabled_is_refused_and_disabled_is_fine() -> None:
    assert validate_config({"model": {"tinker": {"enable": False}}}).model.tinker.enable is False
    with pytest.raises(ConfigError, match="model.tinker.lora_rank: unknown key"):  # Trinity's schema, checked
        validate_config({"model": {"tinker": {"enable": False, "lora_rank": 8}}})
    with pytest.raises(ConfigError, match="model.external_model.url: unknown key"):
        validate_config({"model": {"external_model": {"url": "http://x"}}})
    with pytest.raises(ConfigError, match="model.tinker.enable: true is not supported: Tinker is a remote"):
        validate_config({"model": {"tinker": {"enable": True, "rank": 32}}})


def test_the_data_juicer_service_is_refused() -> None:
    validate_config({"service": {}})
    with pytest.raises(ConfigError, match="service.data_juicer: the Data-Juicer service is not integrated"):
        validate_config({"service": {"data_juicer": {"auto_start": True}}})


def test_save_input_defaults_and_the_path_must_be_json_lines() -> None:
    cfg = validate_config({"data_processor": {"experience_pipeline": {"operators": []}}})
    pipeline = cfg.data_processor.experience_pipeline
    assert pipeline is not None and pipeline.save_input and pipeline.input_save_path is None
    validate_config({"data_processor": {"experience_pipeline": {"input_save_path": "/x/in.jsonl"}}})
    with pytest.raises(ConfigError, match="input_save_path 'sqlite:///x.db': give a .jsonl or .json file"):
        validate_config({"data_processor": {"experience_pipeline": {"input_save_path": "sqlite:///x.db"}}})


def test_trainer_config_path_is_read_as_trainer_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    verl = tmp_path / "verl.yaml"
    verl.write_text("actor_rollout_ref:\n  actor:\n    ppo_micro_batch_size_per_gpu: 3\n")
    cfg = validate_config({"trainer": {"trainer_config_path": str(verl)}})
    assert cfg.trainer.effective_micro_batch_size == 3
    verl.write_text("actor_rollout_ref:\n  actor:\n    strategy: megatron\n")
    with pytest.raises(ConfigError, match="Megatron is not supported"):
        validate_config({"trainer": {"trainer_config_path": str(verl)}})
    with pytest.raises(ConfigError, match="trainer_config_path '/nowhere.yaml': cannot read it"):
        validate_config({"trainer": {"trainer_config_path": "/nowhere.yaml"}})
    with pytest.raises(ConfigError, match="are one setting; give one"):
        validate_config({"trainer": {"trainer_config_path": str(verl), "trainer_config": {"a": 1}}})


def test_an_external_model_is_for_bench_only_and_disabled_is_fine() -> None:
    validate_config({"model": {"external_model": {"enable": False, "model_name": "m"}}})
    remote = {"model_path": "qwen3-max", "external_model": {"enable": True, "model_name": "m"}}
    assert validate_config({"mode": "bench", "model": remote}).model.external_model.enable
    for mode in ("both", "explore", "train"):
        with pytest.raises(
            ConfigError, match=f"model.external_model.enable: true works in mode bench only, not mode {mode}"
        ):
            validate_config({"mode": mode, "model": remote})
