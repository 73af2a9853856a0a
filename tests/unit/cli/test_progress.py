"""`trinity run` console output: which child lines reach the console, how JSON log lines read, and the
progress line built from the services' GetInfo stats."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.cli import progress
from services.cli.progress import (
    CHATTY_EVENTS,
    ProgressReporter,
    eta,
    progress_line,
    render_line,
    should_forward,
)
from services.common.config import load_config
from services.common.errors import Unavailable


def log_line(**record: Any) -> str:
    return json.dumps(record)


# ---- should_forward ------------------------------------------------------------------------------


@pytest.mark.parametrize("event", sorted(CHATTY_EVENTS))
def test_per_step_events_are_kept_off_the_console_unless_verbose(event: str) -> None:
    line = log_line(event=event, level="info", step=3)
    assert should_forward(line, verbose=False) is False
    assert should_forward(line, verbose=True) is True


def test_the_chatty_set_is_the_per_step_events() -> None:
    assert CHATTY_EVENTS == {
        "train_step",
        "explore_step",
        "weights_loaded",
        "version_published",
        "sync",
        "waiting_for_data",
    }


@pytest.mark.parametrize(
    "line",
    [
        log_line(event="serving", address="127.0.0.1:1"),  # a lifecycle event
        log_line(event="train_finished", step=10),
        log_line(level="error", message="no event key"),
        "Traceback (most recent call last):",  # not JSON
        "  train_step happened",  # mentions a chatty event but is not a JSON record
        '{"event": "train_step", broken',  # looks like JSON but is not: shown as is
        "",
    ],
)
def test_everything_but_per_step_events_is_forwarded(line: str) -> None:
    assert should_forward(line, verbose=False) is True


@pytest.mark.parametrize(
    "line",
    [
        "nanobind: leaked 64 types!",
        ' - leaked type "triton._C.libtriton.ir.location"',
        " - ... skipped remainder",
        "nanobind: this is likely caused by a reference counting issue in the binding code.",
    ],
)
def test_triton_exit_leak_reports_stay_in_the_log_file_only(line: str) -> None:
    assert should_forward(line, verbose=False) is False
    assert should_forward(line, verbose=True) is True


# ---- render_line ---------------------------------------------------------------------------------


def test_json_line_renders_as_event_then_fields_without_the_bookkeeping_keys() -> None:
    line = log_line(
        event="serving",
        timestamp="2024-01-01T00:00:00Z",
        logger="x",
        service="buffer",
        level="info",
        request_id="r1",
        address="127.0.0.1:5",
        workers=4,
    )
    assert render_line(line) == "serving address=127.0.0.1:5 workers=4"


def test_level_other_than_info_is_shown_upper_case_first() -> None:
    assert render_line(log_line(event="lease_expired", level="warning", n=2)) == "WARNING lease_expired n=2"
    assert render_line(log_line(event="crashed", level="error")) == "ERROR crashed"


def test_event_without_fields_has_no_trailing_space() -> None:
    assert render_line(log_line(event="stopping", level="info")) == "stopping"


def test_floats_keep_four_significant_digits() -> None:
    assert (
        render_line(log_line(event="e", loss=0.123456789, lr=2e-4, big=123456.7))
        == "e loss=0.1235 lr=0.0002 big=1.235e+05"
    )


def test_long_values_are_cut_to_120_characters() -> None:
    rendered = render_line(log_line(event="e", detail="x" * 200, short="y" * 120))
    detail, short = rendered.split(" ")[1:]
    assert detail == "detail=" + "x" * 117 + "..."
    assert short == "short=" + "y" * 120  # exactly 120: kept whole


@pytest.mark.parametrize("line", ["plain text", "Traceback (most recent call last):", "{not json"])
def test_non_json_lines_are_unchanged(line: str) -> None:
    assert render_line(line) == line


# ---- progress_line -------------------------------------------------------------------------------


@dataclass
class Info:
    """The fields of a GetInfo reply that progress_line reads."""

    state: str
    stats: dict[str, float] = field(default_factory=dict)


def test_progress_line_with_trainer_and_explorer() -> None:
    trainer = Info("training", {"step": 12, "loss": 0.03125, "model_version": 12, "tokens_per_s": 1234.0})
    explorer = Info(
        "exploring",
        {
            "step": 14,
            "model_version": 10,
            "reward_mean": 0.625,
            "experiences_written": 448,
            "tokens_per_s": 987.6,
        },
    )
    line = progress_line(42.4, {"trainer": trainer, "explorer": explorer})
    assert line == (
        "   42s"
        " | trainer training step 12 loss 0.0312 v12 1.2k tok/s"
        " | explorer exploring step 14 v10 reward 0.625 written 448 988 tok/s"
        " | version lag 2"  # trainer v12, explorer still on v10
    )


def test_an_explorer_polled_after_a_newer_version_shows_no_negative_lag() -> None:
    infos = {
        "trainer": Info("reading", {"model_version": 5}),
        "explorer": Info("exploring", {"model_version": 9}),
    }
    assert progress_line(1.0, infos).endswith(" | version lag 0")


def test_the_explorers_latest_eval_score_is_shown_main_score_first() -> None:
    stats = {"step": 7, "eval/e/reward/mean@1": 0.9, "eval/e/accuracy/mean@1": 0.4375, "eval_step": 5}
    line = progress_line(1.0, {"explorer": Info("exploring", stats)})
    assert line.endswith(" | eval 0.438 at step 5")


def test_progress_line_of_one_worker_has_no_version_lag() -> None:
    line = progress_line(5.0, {"trainer": Info("training", {"step": 1, "loss": 1.5, "model_version": 1})})
    assert line == "    5s | trainer training step 1 loss 1.5 v1 0 tok/s"
    assert "lag" not in progress_line(5.0, {"explorer": Info("exploring", {"step": 1})})


def test_missing_loss_shows_a_dash_and_missing_stats_show_zero() -> None:
    line = progress_line(0.0, {"trainer": Info("starting")})
    assert line == "    0s | trainer starting step 0 loss - v0 0 tok/s"


def test_progress_line_without_infos_is_the_elapsed_time_only() -> None:
    assert progress_line(3600.0, {}) == " 3600s"


# ---- ProgressReporter.poll -----------------------------------------------------------------------


@pytest.fixture
def cfg(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "c.yaml"
    path.write_text(f"checkpoint_root_dir: {tmp_path}\n")
    return load_config(path)


async def test_poll_skips_services_that_do_not_answer_and_keeps_the_last_good_infos(
    cfg, monkeypatch: pytest.MonkeyPatch
) -> None:
    down: set[str] = set()
    asked: list[tuple[str, str]] = []

    async def fake_service_info(name: str, address: str, services_cfg: Any, timeout: float) -> Info:
        asked.append((name, address))
        if name in down:
            raise Unavailable(f"{name} is down")
        return Info("running", {"step": 1})

    monkeypatch.setattr(progress, "service_info", fake_service_info)
    reporter = ProgressReporter(cfg, ["trainer", "explorer"])

    first = await reporter.poll()
    assert set(first) == {"trainer", "explorer"}
    assert asked == [("trainer", cfg.services.trainer.address), ("explorer", cfg.services.explorer.address)]

    down.add("explorer")
    second = await reporter.poll()
    assert set(second) == {"trainer"}
    assert reporter.last is second

    down.add("trainer")
    assert await reporter.poll() == {}
    assert reporter.last is second  # nothing answered: the last infos stay


def test_json_that_is_not_our_log_shape_is_rendered_without_crashing_the_pump() -> None:
    assert render_line('{"event": "x", "level": 30}') == "30 x"
    assert render_line("[1, 2]") == "[1, 2]"
    assert should_forward('{"event": ["x"]}', False) is True
    assert should_forward("[1, 2]", False) is True


def test_progress_line_shows_steps_of_the_total_and_the_eta() -> None:
    trainer = Info("training", {"step": 12, "loss": 0.5, "model_version": 12})
    line = progress_line(600.0, {"trainer": trainer}, total_steps=80, eta_s=3725.0)
    assert line == "  600s | trainer training step 12/80 loss 0.5 v12 0 tok/s | ETA 1h02m"
    assert progress_line(1.0, {"trainer": trainer}, 80, 190.4).endswith(
        "step 12/80 loss 0.5 v12 0 tok/s | ETA 3m10s"
    )


def test_eta_is_the_pace_since_the_first_step_seen_times_the_steps_left() -> None:
    # first seen at step 2 after 100 s; at 400 s step 8: 50 s per step, 72 steps left
    assert eta(80, (100.0, 2), (400.0, 8)) == 72 * 50.0
    assert eta(80, (100.0, 2), (150.0, 2)) is None  # no step since: no pace yet
    assert eta(None, (100.0, 2), (400.0, 8)) is None and eta(80, None, (400.0, 8)) is None
    assert eta(8, (100.0, 2), (400.0, 9)) == 0.0  # past the total (a resumed run): nothing left


def test_a_line_per_finished_step_and_a_heartbeat_while_a_step_is_long(cfg) -> None:  # type: ignore[no-untyped-def]
    reporter = ProgressReporter(cfg, ["trainer", "explorer"], quiet_s=30.0)

    def infos(trainer_step: int, explorer_step: int, eval_step: int = 0) -> dict[str, Info]:
        return {
            "trainer": Info("training", {"step": trainer_step}),
            "explorer": Info("exploring", {"step": explorer_step, "eval_step": eval_step}),
        }

    printed = [
        t
        for t, got in [
            (5.0, infos(0, 0)),  # the first poll: a line
            (10.0, infos(0, 0)),  # nothing finished, 5 s after the last line: quiet
            (15.0, infos(0, 1)),  # the explorer finished a step
            (20.0, infos(1, 1)),  # the trainer did
            (45.0, infos(1, 1)),  # 25 s of nothing: still quiet
            (50.0, infos(1, 1)),  # 30 s: a heartbeat
            (55.0, infos(1, 1, eval_step=1)),  # an eval finished
        ]
        if reporter.line_for(t, got) is not None
    ]
    assert printed == [5.0, 15.0, 20.0, 50.0, 55.0]


# ---- pump ----------------------------------------------------------------------------------------


class FullDisk:
    """A log file on a disk that is full for the first `full` writes, then has room."""

    def __init__(self, full: int) -> None:
        self.full, self.written = full, b""

    def write(self, data: bytes) -> None:
        if self.full:
            self.full -= 1
            raise OSError(28, "No space left on device")
        self.written += data


async def test_the_pump_drains_a_child_whose_log_cannot_be_written_and_says_so_once(capsys) -> None:
    async def output():
        for i in range(30):
            yield f"line {i}\n".encode()

    log, tail = FullDisk(full=3), []
    await progress.pump(output(), log, "[buffer] ", tail, verbose=True)
    assert log.written == b"".join(f"line {i}\n".encode() for i in range(3, 30))  # written once there is room
    assert tail == [f"line {i}" for i in range(10, 30)]  # every line read: the child never blocks
    err = capsys.readouterr().err
    assert err.count("cannot be written") == 1 and "No space left on device" in err
