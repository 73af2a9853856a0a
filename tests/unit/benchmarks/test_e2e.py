"""benchmarks/e2e.py pure helpers: step-time figures, the JSON line's shape, our run's config.

No GRPO run here (that is the benchmark); TRL is not needed to import the module.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import e2e
from benchmarks.lib import e2e_figures as figures
from services.common.config import load_config


def test_steady_step_time_excludes_start_up():
    # The first step finished at t=100 (start-up before it is not counted): 3 intervals over 6 s.
    assert figures.steady_step_time([100.0, 101.0, 104.0, 106.0]) == pytest.approx(2.0)
    assert figures.median_interval([100.0, 101.0, 104.0, 106.0]) == pytest.approx(2.0)
    assert figures.median_interval([0.0, 1.0, 2.0, 30.0, 31.0]) == pytest.approx(1.0)


def test_step_time_needs_two_steps():
    with pytest.raises(ValueError, match="at least 2"):
        figures.steady_step_time([1.0])
    with pytest.raises(ValueError, match="at least 2"):
        figures.median_interval([])


def test_tail_mean_is_the_last_quarter_with_at_least_one_value():
    assert figures.tail_mean([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.5]) == pytest.approx(0.75)
    assert figures.tail_mean([0.2, 0.4]) == pytest.approx(0.4)
    with pytest.raises(ValueError):
        figures.tail_mean([])


def test_result_line_shape_and_ratio():
    ours = [
        {"step_times": [10.0, 11.0, 12.0], "rewards": [0.1, 0.2, 0.3], "wall_s": 30.0},
        {"step_times": [0.0, 1.0, 2.0], "rewards": [0.1, 0.2, 0.5], "wall_s": 20.0},
    ]
    trl = [
        {"step_times": [5.0, 7.0, 9.0], "rewards": [0.1, 0.1, 0.4], "wall_s": 15.0},
        {"step_times": [5.0, 7.0, 9.0], "rewards": [0.1, 0.1, 0.4], "wall_s": 15.0},
    ]
    line = figures.result_line(ours, trl, "1.16.0", {"steps": 3})
    required = {"name", "unit", "ours", "baseline", "baseline_name", "ratio", "target_ratio", "config"}
    assert required <= line.keys()
    assert line["lower_is_better"] is True
    assert (line["ours"], line["baseline"], line["ratio"]) == (1.0, 2.0, 0.5)
    assert line["baseline_name"] == "trl.GRPOTrainer 1.16.0"
    config = line["config"]
    assert config["steps"] == 3
    assert config["rounds"] == 2
    assert config["step_s_per_round"] == {"ours": [1.0, 1.0], "trl": [2.0, 2.0]}
    assert config["reward_after_n"] == {"ours": 0.4, "trl": 0.4}
    assert config["reward_first_step"] == {"ours": 0.1, "trl": 0.1}
    assert config["total_wall_s"] == {"ours": 25.0, "trl": 15.0}
    json.dumps(line)  # one JSON line


def test_read_progress_orders_steps(tmp_path: pathlib.Path):
    rows = [
        {"step": 2, "time": 12.0, "metrics": {"critic/rewards/mean": 0.5}},
        {"step": 1, "time": 10.0, "metrics": {"critic/rewards/mean": 0.25}},
    ]
    path = tmp_path / "progress.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert figures.read_progress(path) == ([10.0, 12.0], [0.25, 0.5])


def test_our_config_is_a_valid_one_stage_grpo_run(tmp_path: pathlib.Path):
    import yaml

    args = e2e.parse_args(["--quick"])
    cfg_dict = e2e.our_config(tmp_path, tmp_path / "rl.jsonl", tmp_path / "model", args)
    path = tmp_path / "ours.yaml"
    path.write_text(yaml.safe_dump(cfg_dict))
    cfg = load_config(str(path))
    assert cfg.mode == "both"
    assert cfg.buffer.total_steps == 5
    assert cfg.buffer.batch_size * cfg.algorithm.repeat_times == 128
    assert cfg.algorithm.kl_loss_fn == "none"
    assert cfg.buffer.explorer_input.eval_tasksets == []
    assert cfg.synchronizer.sync_interval == 1


def test_parse_args_defaults():
    full, quick = e2e.parse_args([]), e2e.parse_args(["--quick"])
    assert (full.steps, full.rounds) == (20, 2)
    assert (quick.steps, quick.rounds) == (5, 1)
    with pytest.raises(SystemExit):
        e2e.parse_args(["--steps", "1"])
