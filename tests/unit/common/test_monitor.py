"""TensorBoard scalars written without torch, readable by TensorBoard's own reader; periodic sampling."""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from services.common.monitor import TensorBoardMonitor, every, peak_rss_mb, reset_peak_rss


def scalars(log_dir: pathlib.Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_scalars_are_read_back_by_tensorboard(tmp_path: pathlib.Path) -> None:
    monitor = TensorBoardMonitor(str(tmp_path / "tb"))
    monitor.log({"actor/loss": 0.5, "rollout/reward/mean": 0.25}, step=1)
    monitor.log({"actor/loss": 0.25}, step=2)
    monitor.close()
    assert scalars(tmp_path / "tb", "actor/loss") == [(1, 0.5), (2, 0.25)]
    assert scalars(tmp_path / "tb", "rollout/reward/mean") == [(1, 0.25)]


def test_the_monitor_does_not_import_torch(tmp_path: pathlib.Path) -> None:
    code = "import sys; from services.common.monitor import TensorBoardMonitor as T; T(sys.argv[1]).log({'a': 1.0}, 0); print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "tb")], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


async def test_every_samples_until_cancelled_and_skips_failed_collections(tmp_path: pathlib.Path) -> None:
    monitor = TensorBoardMonitor(str(tmp_path / "tb"))
    calls = 0

    async def collect() -> dict[str, float]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("a service counter failed")
        return {"buffer/q/depth": float(calls)}

    task = asyncio.create_task(every(monitor, 0.01, collect))
    while calls < 4:
        await asyncio.sleep(0.01)
    task.cancel()
    monitor.close()
    values = [v for _, v in scalars(tmp_path / "tb", "buffer/q/depth")]
    assert values[:3] == [1.0, 3.0, 4.0]


def test_the_peak_since_start_survives_a_reset_of_the_kernels_count() -> None:
    import resource

    import numpy as np

    block = np.ones(128 * 1024 * 1024 // 8)  # 128 MiB resident
    del block
    before = peak_rss_mb()
    reset_peak_rss()
    kernel_now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    assert kernel_now < before - 100  # the kernel's count restarted from the current resident set
    assert peak_rss_mb() >= before  # ours did not
