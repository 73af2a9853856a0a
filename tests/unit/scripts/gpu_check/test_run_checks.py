"""scripts/gpu_check/run_checks.py: the shortened demo's and the colocate job's configs, the devices the
services reported in their logs, and the colocate check run whole on CPU. (The demo runs in
`make test-gpu`.)"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
import yaml

from scripts.gpu_check import lab, run_checks
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


def test_colocate_config_is_the_demos_grpo_job_in_mode_colocate(tmp_path: pathlib.Path) -> None:
    tree, overrides = run_checks.colocate_config(
        pathlib.Path(default_config_path()).read_text(), tmp_path / "runs"
    )
    config = tmp_path / "colocate.yaml"
    config.write_text(yaml.safe_dump(tree, sort_keys=False))
    cfg = load_config(str(config), overrides)
    assert cfg.mode == "colocate" and len(cfg.stage_configs) == 1
    assert cfg.algorithm.algorithm_type == "grpo" and cfg.buffer.total_steps == run_checks.COLOCATE_STEPS
    assert not cfg.buffer.explorer_input.eval_tasksets
    assert (cfg.synchronizer.sync_interval, cfg.synchronizer.sync_offset) == (1, 0)
    assert cfg.trainer.bf16 is False and cfg.model.dtype == "float32"  # fp32 on both sides
    assert cfg.algorithm.optimizer.lr == 3e-2


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_the_colocate_check_passes_on_cpu(tmp_path: pathlib.Path) -> None:
    """The check's whole path on CPU, where the weights are shared through mapped files (on a GPU:
    CUDA IPC, run by `make test-gpu`)."""
    repo = pathlib.Path(__file__).resolve().parents[4]
    ctx = lab.Context(device="cpu", work=tmp_path, repo=repo, python=sys.executable)
    figures = run_checks.check_colocate(ctx)
    assert figures["steps"] == run_checks.COLOCATE_STEPS and figures["shared_device"] == "cpu"
    assert figures["ppo_kl_max"] < run_checks.KL_TOL and figures["grad_norm_min"] > 0.01
    assert figures["attached_mib"] > 0 and figures["explorer_cuda_mib_after_attach"] is None
