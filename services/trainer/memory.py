"""Peak memory of each phase of a training step, for the step's metrics (`memory/<phase>_peak_mb`).

Which memory: on CUDA, the peak of the caching allocator's allocated bytes on the trainer's device
(`torch.cuda.max_memory_allocated`, reset at the start of each phase: weights, gradients, optimizer
state and activations, not the allocator's unused cache). On CPU (Linux), the process's peak resident
set (VmHWM in /proc/self/status), reset at the start of each phase (monitor.reset_peak_rss, which
keeps memory/peak_rss_mb the peak since start): everything the process holds, other threads
included. Elsewhere (macOS, or a kernel that refuses the reset) there is no per-phase figure and
`PhasePeaks.available` is false; memory/peak_rss_mb is reported either way.

A phase that runs several times in a step (forward and backward run once per micro-batch) reports
the highest of its runs. Phases nest: an enclosing phase (the whole step) sees the peaks of those
inside it, although each of them restarts the count.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Iterator

import torch

from services.common.monitor import reset_peak_rss

_STATUS = pathlib.Path("/proc/self/status")
MIB = 1024 * 1024


def _read_hwm_mb() -> float:
    """VmHWM (peak resident set since the last reset) in MiB."""
    for line in _STATUS.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1]) / 1024.0  # reported in kB
    raise OSError("no VmHWM line in /proc/self/status")


def rss_peak_supported() -> bool:
    """Can this process reset and read its peak resident set (Linux with /proc)?"""
    try:
        reset_peak_rss()
        _read_hwm_mb()
    except OSError:
        return False
    return True


class PhasePeaks:
    """Measures the peak memory of named phases; `metrics()` gives them in MiB and starts afresh.

    Usage: `with peaks.phase("forward"): ...` around each phase, `peaks.metrics()` once a step.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.available = self.cuda or rss_peak_supported()
        self._peaks: dict[str, float] = {}
        self._open: list[str] = []  # the phases running now, outermost first

    def _reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            reset_peak_rss()

    def _peak_mb(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) / MIB
        return _read_hwm_mb()

    def _fold(self) -> None:
        """Give the running phases the peak counted since the last reset (before it restarts)."""
        if self._open:
            peak = self._peak_mb()
            for name in self._open:
                self._peaks[name] = max(self._peaks.get(name, 0.0), peak)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the peak while the block runs, under `name` (the highest of repeated runs)."""
        if not self.available:
            yield
            return
        self._fold()
        self._reset()
        self._open.append(name)
        try:
            yield
        finally:
            self._fold()
            self._open.pop()

    def metrics(self) -> dict[str, float]:
        """{"memory/<phase>_peak_mb": MiB} of the phases run since the last call."""
        out = {f"memory/{name}_peak_mb": round(value, 1) for name, value in self._peaks.items()}
        self._peaks = {}
        return out
