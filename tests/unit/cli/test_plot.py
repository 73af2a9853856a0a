"""`trinity plot RUN_DIR`: scalars written by the real TensorBoardMonitor are read back and drawn."""

from __future__ import annotations

import pathlib

import pytest

from services.cli.main import main
from services.cli.plot import read_run
from services.common.errors import InvalidArgument
from services.common.monitor import TensorBoardMonitor


def fake_run(run_dir: pathlib.Path) -> None:
    explorer = TensorBoardMonitor(str(run_dir / "monitor" / "tensorboard" / "explorer"))
    explorer.log({"eval/heldout/strict/mean@1": 0.0, "eval/heldout/lenient/mean@1": 0.07}, step=0)
    for step, reward in [(1, 0.1), (2, 0.3), (3, 0.5)]:
        explorer.log({"rollout/reward/mean": reward, "rollout/experiences": 64.0}, step=step)
    explorer.log(
        {
            "eval/heldout/strict/mean@1": 0.6,
            "eval/heldout/lenient/mean@1": 0.7,
            "eval/heldout/reward/mean@1": 0.65,  # a taskset with accuracy curves: its reward is not drawn
            "eval/other/reward/mean@1": 0.4,  # one without: its reward is
        },
        step=3,
    )
    explorer.close()


def test_read_run_series(tmp_path: pathlib.Path) -> None:
    fake_run(tmp_path)
    series = read_run(tmp_path)
    assert series.reward == [(1, pytest.approx(0.1)), (2, pytest.approx(0.3)), (3, pytest.approx(0.5))]
    assert sorted(series.evals) == ["heldout lenient", "heldout strict", "other reward"]
    strict = series.evals["heldout strict"]
    assert [round(v, 3) for _, v in strict] == [0.0, 0.6]
    assert strict[0][0] == pytest.approx(0.0, abs=1e-6)  # minutes from the first scalar
    assert strict[1][0] >= 0.0


def test_a_run_without_explorer_steps_plots_the_trained_rows_reward(tmp_path: pathlib.Path) -> None:
    # mode serve + a train run: only the trainer logs a reward, that of the rows each step trained
    trainer = TensorBoardMonitor(str(tmp_path / "monitor" / "tensorboard" / "trainer"))
    for step, reward in [(1, 0.2), (2, 0.4)]:
        trainer.log({"critic/rewards/mean": reward, "actor/pg_loss": 0.1}, step=step)
    trainer.close()
    series = read_run(tmp_path)
    assert series.reward == [(1, pytest.approx(0.2)), (2, pytest.approx(0.4))]
    assert series.reward_axis == "training step"
    fake_run(tmp_path)  # with explorer steps the rollout reward wins
    assert read_run(tmp_path).reward_axis == "explorer step"


def test_plot_command_writes_a_png(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_run(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(["plot", str(tmp_path)])
    assert done.value.code == 0
    png = tmp_path / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "3 steps" in capsys.readouterr().out


def test_plot_errors_name_the_run_dir(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidArgument, match="monitor_type tensorboard"):
        read_run(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(["plot", str(tmp_path / "nowhere")])
    assert done.value.code == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_run_with_a_learning_curve_is_drawn_against_training_minutes(tmp_path: pathlib.Path) -> None:
    import json

    fake_run(tmp_path)
    curve = [
        {
            "step": 0,
            "train_minutes": 0.0,
            "scores": {"eval/h/strict/mean@1": 0.0, "eval/h/reward/mean@1": 0.1},
        },
        {
            "step": 10,
            "train_minutes": 7.5,
            "scores": {"eval/h/strict/mean@1": 0.4, "eval/h/reward/mean@1": 0.5},
        },
        {"step": 0, "scores": {"eval/h/strict/mean@1": 0.9}},  # no train_minutes (a bench run): left out
    ]
    (tmp_path / "summary.json").write_text(json.dumps({"stages": [{"name": "s", "eval": {"curve": curve}}]}))
    series = read_run(tmp_path)
    assert series.evals == {"h strict": [(0.0, 0.0), (7.5, 0.4)]}  # strict drawn, so not the reward
    assert series.minutes == "training minutes (waits for evals left out)"
    assert len(series.reward) == 3  # the reward per step still comes from the scalars


def test_plot_finds_the_run_dir_from_the_config(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"project: p\nname: n\ncheckpoint_root_dir: {tmp_path / 'runs'}\n")
    fake_run(tmp_path / "runs" / "p" / "n")
    with pytest.raises(SystemExit) as done:
        main(["plot", "-c", str(config)])
    assert done.value.code == 0
    assert (tmp_path / "runs" / "p" / "n" / "plot.png").exists()
    with pytest.raises(SystemExit) as done:
        main(["plot"])
    assert done.value.code == 2
    assert "one of them" in capsys.readouterr().err
