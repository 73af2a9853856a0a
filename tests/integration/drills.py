"""Fault drills of whole `trinity run`s: the trainer's progress and events, which step records are in
the final weights, the services' processes of a run (to SIGKILL them), and the run as a subprocess."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Callable

from tests.conftest import TRINITY


def progress(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "trainer" / "progress.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "trainer" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def in_weights(rows: list[dict], trainer_events: list[dict]) -> tuple[list[dict], list[dict]]:
    """(step records whose update is in the final weights, those a trainer restart discarded).

    A trainer start logs the checkpoint step it resumed from and how many progress lines existed
    then: the records before that line of later steps were not in its weights.
    """
    starts = sorted(
        ((e["at_line"], e["checkpoint_step"]) for e in trainer_events if e["event"] == "resumed"),
        reverse=True,
    )
    live: list[dict] = []
    lost: list[dict] = []
    for line, row in enumerate([*rows, None]):
        while starts and starts[-1][0] <= line:
            checkpoint = starts.pop()[1]
            lost += [r for r in live if r["step"] > checkpoint]
            live = [r for r in live if r["step"] <= checkpoint]
        if row is not None:
            live.append(row)
    return live, lost


def child_pids(marker: str, service: str) -> list[int]:
    """PIDs of `python -m services.<service>` processes whose command line mentions `marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if f"services.{service}" in words and any(marker in w for w in words):
            pids.append(int(entry))
    return pids


def kill_all(marker: str) -> None:
    for service in ("buffer", "synchronizer", "trainer", "explorer"):
        for pid in child_pids(marker, service):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def wait_for(
    what: str, predicate: Callable[[], bool], proc: subprocess.Popen, timeout: float, every: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"trinity run exited ({proc.returncode}) while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def kill_trainer_past_a_checkpoint(
    run_dir: pathlib.Path, save_interval: int, min_steps: int, proc: subprocess.Popen, timeout: float
) -> int:
    """SIGKILL the run's trainer one or more steps past a checkpoint, never on one; returns its last step.

    The tiny model trains several steps per 0.2 s between checkpoint saves, so a slow poll sees only
    checkpoint steps (CI saw the whole run end first). This polls every 5 ms and stops the trainer
    (SIGSTOP) at each new step record once it has `min_steps`: if its last step is not a checkpoint
    step it is killed as it stands, else it goes on (SIGCONT) and is caught at a later step.
    """
    deadline = time.monotonic() + timeout
    seen = min_steps - 1
    while True:
        left = deadline - time.monotonic()
        more = functools.partial(lambda n: len(progress(run_dir)) > n, seen)
        wait_for(f"trainer step record {seen + 1}", more, proc, left, every=0.005)
        [trainer] = child_pids(str(run_dir), "trainer")
        os.kill(trainer, signal.SIGSTOP)
        rows = progress(run_dir)
        if rows[-1]["step"] % save_interval:
            os.kill(trainer, signal.SIGKILL)
            return int(rows[-1]["step"])
        os.kill(trainer, signal.SIGCONT)
        seen = len(rows)


def start_run(config: pathlib.Path, log: pathlib.Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(TRINITY), "run", "--config", str(config)],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=config.parent,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, log: pathlib.Path, timeout: float) -> str:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        raise AssertionError(
            f"trinity run did not finish in {timeout}s:\n{log.read_text()[-4000:]}"
        ) from None
    out = log.read_text()
    assert code == 0, out[-4000:]
    return out


def run_with_trainer_killed(
    config: pathlib.Path, run_dir: pathlib.Path, save_interval: int, min_steps: int, log: pathlib.Path
) -> str:
    """`trinity run` of `config` with its trainer SIGKILLed past a checkpoint (as above) until the
    run ends; returns its output. Whatever happens, no process of the run is left behind."""
    proc: subprocess.Popen | None = None
    try:
        proc = start_run(config, log)
        kill_trainer_past_a_checkpoint(run_dir, save_interval, min_steps, proc, 240)
        return finish(proc, log, timeout=400)
    finally:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        kill_all(str(run_dir))
