"""`trinity plot RUN_DIR`: one PNG of a run, from its TensorBoard scalars (monitor_type tensorboard).

Left: the mean rollout reward per explorer step (`rollout/reward/mean`); a run without explorer
steps (mode serve + a train run: the agents' traffic has no steps) shows the mean reward of the rows
each training step trained (`critic/rewards/mean`) instead. Right: held-out accuracy:
`eval/<taskset>/strict/mean@k` and `lenient` where the taskset reports them (boxed-answer tasksets,
services/explorer/eval.py), else its reward, against training minutes (summary.json's learning
curve, the trainer's waits during evals left out, cli/curve.py) once `trinity run` has written it,
else against minutes since the run's first logged scalar.
Written to RUN_DIR/plot.png unless --out says otherwise.

matplotlib is the optional `[plot]` extra: only this command draws, and no service should pull a
plotting stack into its import path (`pip install 'trinity-grpc[plot]'`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from dataclasses import dataclass, field

from services.common.errors import FailedPrecondition, InvalidArgument

_EVAL_TAG = re.compile(r"^eval/(?P<taskset>[^/]+)/(?P<metric>strict|lenient|reward)/mean@\d+$")


@dataclass
class RunSeries:
    """Scalars read from a run: reward per step, eval curves as (minutes, value) per label."""

    reward: list[tuple[int, float]] = field(default_factory=list)
    reward_axis: str = "explorer step"
    evals: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    minutes: str = "minutes since the run started"


def _curve_evals(run_dir: pathlib.Path) -> dict[str, list[tuple[float, float]]]:
    """Eval curves against train_minutes from RUN_DIR/summary.json ({} when it has none)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    curves: dict[str, list[tuple[float, float]]] = {}
    for stage in summary.get("stages", []):
        for point in stage.get("eval", {}).get("curve", []):
            if "train_minutes" in point and isinstance(scores := point.get("scores"), dict):
                for tag, value in scores.items():
                    curves.setdefault(tag, []).append((float(point["train_minutes"]), float(value)))
    return _pick(curves)


def _pick(curves: dict[str, list[tuple[float, float]]]) -> dict[str, list[tuple[float, float]]]:
    """Strict and lenient curves of each taskset, its reward where it has neither; labelled."""
    wanted = {tag: m for tag in curves if (m := _EVAL_TAG.match(tag))}
    has_accuracy = {m["taskset"] for m in wanted.values() if m["metric"] != "reward"}
    return {
        f"{m['taskset']} {m['metric']}": sorted(curves[tag])
        for tag, m in sorted(wanted.items())
        if not (m["metric"] == "reward" and m["taskset"] in has_accuracy)
    }


def read_run(run_dir: str | pathlib.Path) -> RunSeries:
    """Every service's event files under RUN_DIR/monitor/tensorboard/ into one RunSeries."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = pathlib.Path(run_dir) / "monitor" / "tensorboard"
    if not root.is_dir():
        raise InvalidArgument(
            f"{root} does not exist: is RUN_DIR a run with monitor_type tensorboard?", field="run_dir"
        )
    scalars: dict[str, list[tuple[float, int, float]]] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.wall_time, e.step, e.value) for e in acc.Scalars(tag))
    if not scalars:
        raise InvalidArgument(f"no scalars under {root} yet", field="run_dir")
    start = min(t for events in scalars.values() for t, _, _ in events)
    series = RunSeries(reward=sorted((s, v) for _, s, v in scalars.get("rollout/reward/mean", [])))
    if not series.reward and (trained := scalars.get("critic/rewards/mean")):
        series.reward, series.reward_axis = sorted((s, v) for _, s, v in trained), "training step"
    series.evals = _curve_evals(pathlib.Path(run_dir))
    if series.evals:
        series.minutes = "training minutes (waits for evals left out)"
    else:
        series.evals = _pick(
            {tag: [((t - start) / 60.0, v) for t, _, v in events] for tag, events in scalars.items()}
        )
    return series


def draw(series: RunSeries, out: str | pathlib.Path, title: str) -> pathlib.Path:
    """The two panels as a PNG at `out`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise FailedPrecondition("trinity plot needs matplotlib: pip install 'trinity-grpc[plot]'") from exc
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if series.reward:
        steps, values = zip(*series.reward, strict=True)
        left.plot(steps, values, marker=".")
    left.set(xlabel=series.reward_axis, ylabel="mean rollout reward", title="reward per step")
    for label, points in series.evals.items():
        minutes, values = zip(*points, strict=True)
        right.plot(minutes, values, marker="o", label=label)
    right.set(xlabel=series.minutes, ylabel="held-out", title="held-out accuracy", ylim=(0, 1.05))
    if series.evals:
        right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path = pathlib.Path(out)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def cmd_plot(args: argparse.Namespace) -> int:
    from services.common.errors import InvalidArgument, TrinityError

    try:
        if (args.run_dir is None) == (args.config is None):
            raise InvalidArgument("give a run directory or --config, one of them", field="run_dir")
        if args.config is not None:
            from services.common.config import load_config

            run_dir = pathlib.Path(load_config(args.config).run_dir)
        else:
            run_dir = pathlib.Path(args.run_dir)
        series = read_run(run_dir)
        path = draw(series, args.out or run_dir / "plot.png", title=run_dir.name)
    except TrinityError as exc:
        print(f"trinity plot: {exc}", file=sys.stderr)
        return 2
    print(f"{path}: {len(series.reward)} steps, eval curves: {', '.join(series.evals) or 'none'}")
    return 0


def add_plot_parser(sub: argparse._SubParsersAction) -> None:
    plot = sub.add_parser("plot", help="a PNG of a run: reward per step, held-out accuracy vs minutes")
    plot.add_argument("run_dir", nargs="?", help="the run directory (<checkpoint_root_dir>/<project>/<name>)")
    plot.add_argument("-c", "--config", help="the run's config instead of its directory")
    plot.add_argument("--out", help="PNG path (default RUN_DIR/plot.png)")
    plot.set_defaults(func=cmd_plot)
