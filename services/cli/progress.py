"""Live progress for `trinity run`: one line every few seconds from each service's GetInfo, and a
filter that keeps per-step log lines (summarized by that line) and records of benign third-party
output (deprecation warnings, vLLM's reload warnings for modules without weights of their own) off
the console. Every line still goes to <run dir>/logs/<service>.log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterable
from typing import Any

from services.cli.stages import main_first
from services.cli.status import service_info
from services.common.config import TrinityConfig
from services.common.errors import TrinityError
from services.common.logging import QUIET_EVENTS

# Per-step events: the progress line summarizes them; `trinity run --verbose` shows them too.
CHATTY_EVENTS = frozenset(
    {"train_step", "explore_step", "weights_loaded", "version_published", "sync", "waiting_for_data"}
)


# Lines third-party code prints at interpreter exit that say nothing about the run: triton's nanobind
# module (pulled in by vLLM) reports dozens of "leaked" objects whenever a vLLM explorer exits.
EXIT_NOISE = (
    "nanobind: leaked ",
    " - leaked ",
    " - ... skipped remainder",
    "nanobind: this is likely caused by a reference counting issue",
    "See https://nanobind.readthedocs.io/en/latest/refleaks.html",
)


def should_forward(line: str, verbose: bool) -> bool:
    """Forward non-JSON lines (tracebacks, prints) and every event except the per-step ones and the
    records of benign third-party output."""
    if not verbose and line.startswith(EXIT_NOISE):
        return False
    if verbose or not line.startswith("{"):
        return True
    try:
        record = json.loads(line)
    except ValueError:
        return True
    event = record.get("event", "") if isinstance(record, dict) else ""
    # QUIET_EVENTS: third-party output known to be benign (services.common.logging.log_benign)
    return not isinstance(event, str) or (event not in CHATTY_EVENTS and event not in QUIET_EVENTS)


# A new value of any of these (service, stat) means a step or an eval finished: worth a progress line.
STEP_KEYS = (("trainer", "step"), ("explorer", "step"), ("explorer", "eval_step"))

_HIDDEN_KEYS = frozenset({"event", "timestamp", "logger", "service", "level", "request_id"})


def render_line(line: str) -> str:
    """A JSON log line as `event key=value ...` (level shown when not info); other lines unchanged."""
    if not line.startswith("{"):
        return line
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict):
        return line
    level = str(record.get("level", "info"))
    fields = " ".join(f"{k}={_short(v)}" for k, v in record.items() if k not in _HIDDEN_KEYS)
    text = f"{record.get('event', '')} {fields}".rstrip()
    return text if level == "info" else f"{level.upper()} {text}"


async def pump(
    lines: AsyncIterable[bytes], log_file: Any, prefix: str, tail: list[str], *, verbose: bool
) -> None:
    """Copy a child's output lines to its log file, keep the last 20 in `tail`, and print the ones
    should_forward keeps, until the child closes its output. A line that cannot be written (a full
    disk) is dropped, said once on stderr: the pipe is drained all the same, else the child would
    block on its next write and the whole run with it."""
    said = False
    async for raw in lines:
        line = raw.decode(errors="replace").rstrip()
        tail[:] = (tail + [line])[-20:]
        try:
            log_file.write(raw)
            if should_forward(line, verbose):
                print(prefix + render_line(line), flush=True)
        except OSError as exc:
            if not said:
                said = True
                with contextlib.suppress(OSError):
                    print(
                        f"{prefix}its output cannot be written ({exc}); dropping it meanwhile",
                        file=sys.stderr,
                    )


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _fmt(value: float) -> str:
    if value != value:  # NaN
        return "-"
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}k"
    return f"{value:.3g}"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


def progress_line(
    elapsed: float, infos: dict[str, Any], total_steps: int | None = None, eta_s: float | None = None
) -> str:
    """e.g. `42s | trainer step 12/80 loss 0.03 v12 1.2k tok/s | explorer step 14 v12 reward 0.62 | … | ETA 3m10s`."""
    parts = [f"{elapsed:5.0f}s"]
    trainer = infos.get("trainer")
    if trainer is not None:
        s = trainer.stats
        of = f"/{total_steps}" if total_steps else ""
        parts.append(
            f"trainer {trainer.state} step {int(s.get('step', 0))}{of} loss {_fmt(s.get('loss', float('nan')))} "
            f"v{int(s.get('model_version', 0))} {_fmt(s.get('tokens_per_s', 0.0))} tok/s"
        )
    explorer = infos.get("explorer")
    if explorer is not None:
        s = explorer.stats
        parts.append(
            f"explorer {explorer.state} step {int(s.get('step', 0))} v{int(s.get('model_version', 0))} "
            f"reward {_fmt(s.get('reward_mean', 0.0))} written {int(s.get('experiences_written', 0))} "
            f"{_fmt(s.get('tokens_per_s', 0.0))} tok/s"
        )
    if explorer is not None:
        scores = {k: v for k, v in explorer.stats.items() if k.startswith("eval/")}
        if scores:
            value = next(iter(main_first(scores).values()))
            parts.append(f"eval {value:.3f} at step {int(explorer.stats.get('eval_step', 0))}")
    if trainer is not None and explorer is not None:
        # versions the explorer's weights are behind the trainer's (the two are polled apart, so a
        # momentarily newer explorer reads as 0, not as a negative lag)
        lag = trainer.stats.get("model_version", 0) - explorer.stats.get("model_version", 0)
        parts.append(f"version lag {max(0, int(lag))}")
    if eta_s is not None:
        parts.append(f"ETA {_clock(eta_s)}")
    return " | ".join(parts)


def eta(total_steps: int | None, first: tuple[float, int] | None, now: tuple[float, int]) -> float | None:
    """Seconds left at the pace since `first` ((elapsed, trainer step) when a step was first seen)."""
    if not total_steps or first is None or now[1] <= first[1]:
        return None
    per_step = (now[0] - first[0]) / (now[1] - first[1])
    return max(total_steps - now[1], 0) * per_step


class ProgressReporter:
    """Polls GetInfo of the given services every `interval_s` and prints a progress line when a step
    or an eval finished since the last line (one line per step when steps are slower than a poll),
    else every `quiet_s` so a long step still shows it is alive."""

    def __init__(
        self, cfg: TrinityConfig, services: list[str], interval_s: float = 5.0, quiet_s: float = 30.0
    ) -> None:
        self.cfg = cfg
        self.services = services
        self.interval_s = interval_s
        self.started = time.monotonic()
        self.last: dict[str, Any] = {}
        self.total_steps = cfg.trainer.total_steps or cfg.buffer.total_steps
        self.first_step: tuple[float, int] | None = None  # (elapsed, step) when a trainer step was first seen
        self.quiet_s = quiet_s
        self._printed: tuple[float, tuple[int, ...]] | None = None  # (elapsed, steps) of the last line

    async def poll(self) -> dict[str, Any]:
        infos = {}
        for name in self.services:
            address = self.cfg.services.endpoint(name).address  # type: ignore[arg-type]
            try:
                infos[name] = await service_info(name, address, self.cfg.services, timeout=2.0)
            except TrinityError:
                continue
        if infos:
            self.last = infos
        return infos

    def line_for(self, elapsed: float, infos: dict[str, Any]) -> str | None:
        """The progress line to print now, or None when nothing finished and the last line is recent."""
        step = int(infos["trainer"].stats.get("step", 0)) if "trainer" in infos else 0
        if self.first_step is None and step > 0:
            self.first_step = (elapsed, step)
        steps = tuple(int(infos[name].stats.get(key, 0)) for name, key in STEP_KEYS if name in infos)
        if (
            self._printed is not None
            and steps == self._printed[1]
            and elapsed - self._printed[0] < self.quiet_s
        ):
            return None
        self._printed = (elapsed, steps)
        left = eta(self.total_steps, self.first_step, (elapsed, step))
        return progress_line(elapsed, infos, self.total_steps, left)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            infos = await self.poll()
            line = self.line_for(time.monotonic() - self.started, infos) if infos else None
            if line is not None:
                print(f"[{'progress':<12}] " + line, flush=True)
