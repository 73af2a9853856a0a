"""Per-phase peak memory: a phase that allocates shows it, the next one starts afresh, repeats keep
the highest, and the process's peak since start survives the resets."""

from __future__ import annotations

import torch

from services.common.monitor import peak_rss_mb
from services.trainer.memory import PhasePeaks

MB = 1024 * 1024


def touch(megabytes: int) -> torch.Tensor:
    """A tensor whose pages are all resident (ones, not empty)."""
    return torch.ones(megabytes * MB // 4, dtype=torch.float32)


def test_a_phase_reports_what_it_allocated_and_the_next_one_starts_afresh() -> None:
    peaks = PhasePeaks(torch.device("cpu"))
    assert peaks.available  # Linux: /proc/self/clear_refs and VmHWM
    with peaks.phase("big"):
        big = touch(256)
        del big
    with peaks.phase("small"):
        small = touch(16)
        del small
    with peaks.phase("small"):  # a repeat keeps the higher of the two
        pass
    metrics = peaks.metrics()
    assert set(metrics) == {"memory/big_peak_mb", "memory/small_peak_mb"}
    # Loose: the 256 MiB show in the first phase only (the allocator returns a block this large).
    assert metrics["memory/big_peak_mb"] - metrics["memory/small_peak_mb"] > 200
    assert peak_rss_mb() >= metrics["memory/big_peak_mb"] - 1.0  # the reset lowered the kernel's count only
    assert peaks.metrics() == {}


def test_an_enclosing_phase_sees_the_peaks_of_the_phases_inside_it() -> None:
    peaks = PhasePeaks(torch.device("cpu"))
    with peaks.phase("step"):
        with peaks.phase("forward"):
            big = touch(256)
            del big
        with peaks.phase("optimizer"):  # restarts the count: the 256 MiB are not in this one
            pass
    metrics = peaks.metrics()
    assert metrics["memory/step_peak_mb"] >= metrics["memory/forward_peak_mb"]
    assert metrics["memory/forward_peak_mb"] - metrics["memory/optimizer_peak_mb"] > 200
