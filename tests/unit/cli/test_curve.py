"""summary.json's learning curve: eval records against training minutes (cli/curve.py)."""

from __future__ import annotations

import json
import pathlib

from services.cli.curve import learning_curve
from services.common.config import load_config


def write_lines(path: pathlib.Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def evaluated(at: float, eval_s: float, step: int, strict: float, mode: str = "both") -> dict:
    scores = {"eval/h/strict/mean@1": strict, "eval/h/boxed/mean@1": 0.5, "eval/h/tasks": 200.0}
    return {"time": at, "eval_s": eval_s, "step": step, "model_version": step, "mode": mode, "scores": scores}


def stepped(step: int, at: float, read_s: float = 0.0, work_s: float = 0.0) -> dict:
    """A trainer step record: it waited `read_s` for its batch, then worked `work_s` until `at`."""
    return {"step": step, "time": at, "metrics": {"time/read": read_s, "time/step": work_s}}


def curve_of(tmp_path: pathlib.Path, starts: list[float], steps: list[dict], evals: list[dict]) -> list[dict]:
    """The learning curve of a run whose trainer started at `starts`, stepped and was evaluated so."""
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}"])
    run = pathlib.Path(cfg.run_dir)
    write_lines(
        run / "trainer" / "events.jsonl", [{"event": "resumed", "time": t, "at_line": 0} for t in starts]
    )
    write_lines(run / "trainer" / "progress.jsonl", steps)
    write_lines(run / "eval" / "results.jsonl", evals)
    return learning_curve(cfg)


def test_train_minutes_leave_out_the_trainers_waits_during_evals(tmp_path: pathlib.Path) -> None:
    # on-policy: step 1 waits 100-110 and works 110-130; step 2 waits 130-165 (through the eval at
    # 140-150, then for the batch sampled after it) and works 165-190
    curve = curve_of(
        tmp_path,
        [100.0],
        [stepped(1, 130.0, 10.0, 20.0), stepped(2, 190.0, 35.0, 25.0)],
        [
            evaluated(150.0, 10.0, 1, 0.2),  # began 140: 40 s of training
            evaluated(95.0, 20.0, 0, 0.0, mode="bench"),  # start of stage, before the trainer: 0
            evaluated(185.0, 5.0, 2, 0.4),  # began 180: 80 s less the 10 s waited during the eval = 70 s
            # after the run: up to the last step (190) = 90 s, less those 10 s; the eval at 180-185
            # ran while the trainer worked, so it is not left out
            evaluated(230.0, 20.0, 2, 0.5, mode="bench"),
        ],
    )

    assert [p["train_minutes"] for p in curve] == [
        0.0,
        round(40 / 60, 2),
        round(70 / 60, 2),
        round(80 / 60, 2),
    ]

    assert [p["step"] for p in curve] == [0, 1, 2, 2]
    assert list(curve[1]["scores"]) == ["eval/h/strict/mean@1", "eval/h/boxed/mean@1"]  # main first
    assert curve[2]["scores"]["eval/h/strict/mean@1"] == 0.4


def test_an_eval_the_trainer_trained_through_is_not_left_out(tmp_path: pathlib.Path) -> None:
    # fully asynchronous: the trainer works 105-150 and 150-195 on rows already written while the
    # explorer evaluates 120-170; the evals' 50 s were training time
    curve = curve_of(
        tmp_path,
        [100.0],
        [stepped(1, 150.0, 5.0, 45.0), stepped(2, 195.0, 0.0, 45.0)],
        [evaluated(170.0, 50.0, 1, 0.2), evaluated(200.0, 2.0, 2, 0.4)],
    )
    assert [p["train_minutes"] for p in curve] == [round(20 / 60, 2), round(95 / 60, 2)]


def test_evals_of_two_explorers_at_once_are_left_out_once(tmp_path: pathlib.Path) -> None:
    # the trainer waits 100-160; two evals overlap (110-140 and 120-150): 40 s of waiting left out
    curve = curve_of(
        tmp_path,
        [100.0],
        [stepped(1, 180.0, 60.0, 20.0)],
        [evaluated(140.0, 30.0, 0, 0.1), evaluated(150.0, 30.0, 0, 0.1), evaluated(200.0, 5.0, 1, 0.3)],
    )
    assert curve[-1]["train_minutes"] == round((80 - 40) / 60, 2)


def test_a_run_that_trained_nothing_has_no_train_minutes(tmp_path: pathlib.Path) -> None:
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}"])
    write_lines(
        pathlib.Path(cfg.run_dir) / "eval" / "results.jsonl", [evaluated(5.0, 1.0, 0, 0.1, mode="bench")]
    )
    [point] = learning_curve(cfg)
    assert "train_minutes" not in point and point["scores"]["eval/h/strict/mean@1"] == 0.1


def test_a_continued_run_counts_no_time_between_its_trainer_starts(tmp_path: pathlib.Path) -> None:
    # first run: trainer up 100-190 (steps at 130, 190), end-of-stage eval, then 2 h later
    # `total_steps` raised: the trainer starts again at 7500 and steps at 7540, 7600
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}"])
    run = pathlib.Path(cfg.run_dir)
    write_lines(
        run / "trainer" / "events.jsonl",
        [
            {"event": "resumed", "time": 100.0, "at_line": 0},
            {"event": "resumed", "time": 7500.0, "at_line": 2},
        ],
    )
    write_lines(
        run / "trainer" / "progress.jsonl",
        # step 2 waits 130-160 (through the eval at 140-150), step 4 7540-7570 (the one at 7555-7560)
        [
            stepped(1, 130.0),
            stepped(2, 190.0, 30.0, 30.0),
            stepped(3, 7540.0),
            stepped(4, 7600.0, 30.0, 30.0),
        ],
    )
    write_lines(
        run / "eval" / "results.jsonl",
        [
            evaluated(150.0, 10.0, 1, 0.2),  # began 140: 40 s
            evaluated(230.0, 20.0, 2, 0.5, mode="bench"),  # end of the first run: 90 - 10 = 80 s
            evaluated(7480.0, 20.0, 2, 0.5, mode="bench"),  # start of the second: still 80 s
            evaluated(7560.0, 5.0, 3, 0.6),  # began 7555: 90 + 55 - 10 = 135 s
            evaluated(7650.0, 20.0, 4, 0.8, mode="bench"),  # after the last step: 90 + 100 - 15 = 175 s
        ],
    )

    minutes = [p["train_minutes"] for p in learning_curve(cfg)]

    assert minutes == [round(s / 60, 2) for s in (40, 80, 80, 135, 175)]
