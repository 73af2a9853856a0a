"""The trainer's replay journal (real files) and the progress tally that summary.json's counters use."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from services.trainer.replay import ReplayJournal
from services.trainer.tally import tally, tally_dir
from tests.fakes.trainer import experience


def rows(*ids: str) -> list:
    return [experience("1+2=", "3", task_id=i, reward=0.5, logprobs=True) for i in ids]


def test_journaled_steps_after_the_checkpoint_come_back_pending_in_order(tmp_path: pathlib.Path) -> None:
    journal = ReplayJournal(str(tmp_path), "trainer")
    for step in (1, 2, 3, 4):
        written = journal.record(step, rows(f"s{step}a", f"s{step}b"), [False, True], [f"L{step}"], {"q": 2})
        assert written > 0
    assert journal.checkpointed(2) == 2  # steps 1 and 2 are in the checkpoint: dropped

    pending = ReplayJournal(str(tmp_path), "trainer").resume(checkpoint_step=3)  # a new process

    assert [e.step for e in pending] == [4]  # step 3 is in the checkpoint the trainer resumed from
    [entry] = pending
    assert entry.leases == ["L4"] and entry.is_expert == [False, True] and entry.per_buffer == {"q": 2}
    assert [e.task_id for e in entry.experiences] == ["s4a", "s4b"]
    original = rows("s4a")[0]
    assert np.array_equal(entry.experiences[0].tokens, original.tokens)
    assert entry.experiences[0].prompt_length == original.prompt_length
    assert np.array_equal(entry.experiences[0].logprobs, original.logprobs)
    assert entry.experiences[0].reward == 0.5
    assert os.path.basename(entry.path).startswith("pending-")


def test_a_replayed_step_replaces_its_pending_file_even_if_the_trainer_dies_right_after(
    tmp_path: pathlib.Path,
) -> None:
    journal = ReplayJournal(str(tmp_path), "trainer")
    journal.record(6, rows("a"), [False], ["L6"], {})
    journal.record(7, rows("b"), [False], ["L7"], {})
    first, second = journal.resume(checkpoint_step=5)
    # replayed as step 9 (journaled), then killed before the pending file was removed
    journal.record(9, first.experiences, first.is_expert, [], {}, replaces=first.path)

    again = ReplayJournal(str(tmp_path), "trainer").resume(checkpoint_step=5)

    # step 9's own file is after the checkpoint too: it is pending now, and step 6's is gone
    assert [(e.step, [x.task_id for x in e.experiences]) for e in again] == [(7, ["b"]), (9, ["a"])]


def test_turned_off_it_writes_nothing_and_clears_what_an_earlier_run_left(tmp_path: pathlib.Path) -> None:
    ReplayJournal(str(tmp_path), "trainer").record(3, rows("a"), [False], ["L"], {})
    off = ReplayJournal(str(tmp_path), "trainer", enabled=False)
    assert off.record(4, rows("b"), [False], ["M"], {}) == 0
    assert off.resume(checkpoint_step=0) == []
    assert os.listdir(off.root) == []


def step(n: int, *row_ids: str, replayed: bool = False, reward: float = 0.0) -> dict:
    record: dict = {"step": n, "rows": list(row_ids), "metrics": {"critic/rewards/mean": reward}}
    if replayed:
        record["replayed"] = True
    return record


def test_tally_with_replay_counts_each_row_once_after_a_crash() -> None:
    # steps 1-4 (checkpoint at 2), a crash, a restart after published version 4: steps 3 and 4 are
    # replayed as 5 and 6, then step 7 reads new rows
    progress = [step(1, "a"), step(2, "b"), step(3, "c"), step(4, "d")]
    progress += [step(5, "c", replayed=True), step(6, "d", replayed=True), step(7, "e")]
    events = [
        {"event": "resumed", "at_line": 0, "checkpoint_step": 0, "replay": True},
        {"event": "resumed", "at_line": 4, "checkpoint_step": 2, "replay": True},
        {"event": "dropped", "reason": "untrainable", "rows": ["x", "y"]},
    ]
    got = tally(progress, events)
    assert (got.steps, got.trained, got.updates_lost, got.awaiting_replay) == (7, 5, 0, 0)
    assert got.dropped == {"untrainable": 2}


def test_tally_without_replay_reports_the_lost_updates_and_their_rows() -> None:
    progress = [step(1, "a", "b"), step(2, "c", "d"), step(3, "e", "f"), step(4, "g", "h")]
    events = [{"event": "resumed", "at_line": 3, "checkpoint_step": 1, "replay": False}]
    got = tally(progress, events)
    # steps 2 and 3 were after the checkpoint when the trainer restarted; step 4 came after that
    assert (got.trained, got.updates_lost, got.dropped) == (4, 2, {"update_lost": 4})


def test_tally_counts_rows_waiting_for_replay_and_skipped_ones() -> None:
    progress = [step(1, "a"), step(2, "b"), step(3, "c")]
    resumed = {"event": "resumed", "at_line": 3, "checkpoint_step": 1, "replay": True}
    assert tally(progress, [resumed]).awaiting_replay == 2  # b and c: in the journal, not trained yet
    skipped = {"event": "replay_skipped", "rows": ["c"]}
    got = tally([*progress, step(4, "b", replayed=True)], [resumed, skipped])
    assert (got.trained, got.awaiting_replay, got.dropped) == (2, 0, {"replay_skipped": 1})


def test_tally_dir_skips_a_half_written_line_without_shifting_positions(tmp_path: pathlib.Path) -> None:
    lines = [json.dumps(step(1, "a")), '{"step": 2, "ro', json.dumps(step(3, "c"))]
    (tmp_path / "progress.jsonl").write_text("\n".join(lines) + "\n")
    event = {"event": "resumed", "at_line": 2, "checkpoint_step": 0, "replay": False}
    (tmp_path / "events.jsonl").write_text(json.dumps(event) + "\n")
    got = tally_dir(str(tmp_path))
    # the resume came after line 2 (the broken one): step 1 is lost, step 3 is live
    assert (got.trained, got.updates_lost, got.steps) == (1, 1, 3)
