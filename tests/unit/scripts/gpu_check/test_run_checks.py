"""scripts/gpu_check/run_checks.py's pure parts: the shortened demo's config and the devices the
services reported in their logs. (The demo itself runs in `make test-gpu`.)"""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from scripts.gpu_check import run_checks
from scripts.gpu_check.report import CheckSkipped
from services.common.config.loader import default_config_path, load_config


def test_demo_config_shortens_both_stages_and_validates(tmp_path: pathlib.Path) -> None:
    tree, overrides = run_checks.demo_config(
        pathlib.Path(default_config_path()).read_text(), tmp_path / "runs"
    )
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(tree, sort_keys=False))
    cfg = load_config(str(config), overrides)
    sft, grpo = cfg.stage_configs
    assert (sft.buffer.total_steps, grpo.buffer.total_steps) == (run_checks.SFT_STEPS, run_checks.GRPO_STEPS)
    assert cfg.checkpoint_root_dir == str(tmp_path / "runs")
    assert cfg.monitor.monitor_type == "none" and cfg.explorer.eval_interval == 1000
    assert {cfg.services.endpoint(s).port for s in ("buffer", "synchronizer", "trainer", "explorer")} == {0}
    stages = (sft.algorithm.algorithm_type, grpo.algorithm.algorithm_type)
    assert stages == ("sft", "grpo")  # the demo's stages, unchanged


def test_devices_in_logs_reads_the_build_events_of_every_stage(tmp_path: pathlib.Path) -> None:
    def write(stage: str, name: str, *records: dict) -> None:
        logs = tmp_path / stage / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        lines = ["Traceback (not JSON)", "{broken", *(json.dumps(r) for r in records)]
        (logs / name).write_text("\n".join(lines) + "\n")

    write("sft", "trainer.log", {"event": "trainer_engine_built", "device": "cuda:0"}, {"event": "step"})
    write("grpo", "trainer.log", {"event": "trainer_engine_built", "device": "cuda"})
    write("grpo", "explorer.log", {"event": "rollout_engine_built", "device": "cuda:0", "index": 0})
    assert run_checks.devices_in_logs(tmp_path) == {"trainer": ["cuda"], "rollout": ["cuda"]}
    write("grpo", "explorer.log", {"event": "rollout_engine_built", "device": "cpu"})
    assert run_checks.devices_in_logs(tmp_path) == {"trainer": ["cuda"], "rollout": ["cpu"]}
    assert run_checks.devices_in_logs(tmp_path / "none") == {"trainer": [], "rollout": []}


def test_colocate_is_listed_as_not_implemented() -> None:
    with pytest.raises(CheckSkipped, match="not implemented"):
        run_checks.check_colocate(None)  # type: ignore[arg-type]
