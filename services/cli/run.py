"""`trinity run`: every service of the config's mode as a child process on this machine.

Per stage: buffer and synchronizer start first; the eval tasksets are scored on the stage's
starting weights (an explorer in bench mode); then the trainer and/or explorer run until they
finish, with a progress line every few seconds; the eval tasksets are scored again on the
stage's final checkpoint; `<run dir>/summary.json` is updated; the next stage starts from this
stage's final weights. A child that dies unexpectedly is restarted (up to `max_restarts` times;
children.py): the services resume from the buffer's cursors and the trainer's latest checkpoint.
Ctrl-C stops everything (SIGTERM, then SIGKILL after the grace). Re-running the same command
continues an unfinished run (continue_from_checkpoint) and skips finished stages, except one whose
buffer.total_steps was raised: it trains on from its last checkpoint.

Modes: `both` runs trainer and explorer, `train` the trainer alone (file datasets, or a queue
filled by other writers), `explore` the explorer alone (rollouts into the buffer, no weight
sync), `bench` no worker: every full checkpoint of the run dir is scored in order (only the
latest with explorer.bench_on_latest_checkpoint), and is re-scored each time it is run; `serve` the
explorer as the OpenAI-compatible proxy until Ctrl-C (docs/serve.md; its trainer is a `mode: train`
trainer started beside it, `trinity serve trainer --set mode=train`). A run
without stages is named in the summary by its name, plus `:<mode>` unless the mode is `both`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from services.cli import stages as st
from services.cli.children import ChildProcesses
from services.cli.counts import record_counts, record_serve_counts
from services.cli.curve import learning_curve
from services.cli.memory_watch import run_watched
from services.cli.prepare import (
    INFRA,
    WORKERS_OF_MODE,
    fresh_run_overrides,
    pinned_cpus,
    preflight,
    prepare_data,
    reopen_writers,
    replica_overrides,
    resolve_ports,
    say,
    write_resolved_config,
)
from services.cli.progress import ProgressReporter
from services.common.config import TrinityConfig, load_config
from services.common.errors import TrinityError
from services.synchronizer.transfer.shared import remove_run_shares


class StageRunner(ChildProcesses):
    """Runs one stage's services; see the module docstring."""

    async def run(self, entry: dict[str, Any], save: Any) -> int:
        started = time.monotonic()
        try:
            for name in INFRA:
                await self.start(name)
                say(f"{name} is SERVING at {self.cfg.services.endpoint(name).address}")  # type: ignore[arg-type]
            has_eval = bool(self.cfg.buffer.explorer_input.eval_tasksets)
            if self.cfg.mode == "bench":
                entry["eval"] = await self.bench_checkpoints()
                entry["status"] = "complete"
                return 0
            if (
                has_eval and "start" not in entry["eval"] and self.cfg.mode != "serve"
            ):  # serve: agents evaluate
                entry["eval"]["start"] = await self.bench("start")
                save()
            workers = WORKERS_OF_MODE[self.cfg.mode]
            if workers:
                # the start was scored just above: the explorer need not score the same weights again
                code = await self.run_workers(workers, startup_eval=not entry["eval"].get("start"))
                if code != 0:
                    return code
            await record_counts(self.cfg, entry)
            if has_eval:
                entry["eval"]["end"] = await self.bench("end")
                entry["eval"]["curve"] = learning_curve(self.cfg)
            entry["status"] = "complete"
            return 0
        except (asyncio.TimeoutError, TimeoutError, RuntimeError, TrinityError) as exc:
            say(f"stage failed: {exc}", err=True)
            return 1
        finally:
            entry["wall_s"] = round(entry.get("wall_s", 0.0) + time.monotonic() - started, 1)
            if self.cfg.mode == "serve" and entry["status"] != "complete" and "buffer" in self.children:
                await record_serve_counts(self.cfg, entry, self.stop)  # ended by Ctrl-C
            save()
            await self.stop_all()
            if self.cfg.mode == "colocate":  # the trainer shares its weights anew whenever it starts
                remove_run_shares(self.cfg.run_dir)

    async def bench(self, when: str) -> dict[str, float]:
        """Score the eval tasksets with an explorer in bench mode (starting weights, or the latest checkpoint)."""
        say(f"evaluating ({when} of stage)")
        records = await self._run_bench_explorer(latest_only=True)
        scores = st.main_first(records[-1]["scores"])
        first = next(iter(scores))
        say(f"eval {when}: {first} = {scores[first]:.4f} (model version {records[-1]['model_version']})")
        return scores

    async def bench_checkpoints(self) -> dict[str, Any]:
        """mode bench: score every full checkpoint of the run in order (only the latest with
        explorer.bench_on_latest_checkpoint; the model itself when there is none).

        Returns the summary's eval entry: start = the first version scored, end = the last, and
        `by_version` = {version: scores} for each.
        """
        latest_only = self.cfg.explorer.bench_on_latest_checkpoint
        say(f"evaluating {'the latest checkpoint' if latest_only else 'every checkpoint in order'}")
        records = await self._run_bench_explorer(latest_only=latest_only)
        by_version = {str(r["model_version"]): st.main_first(r["scores"]) for r in records}
        for version, scores in by_version.items():
            first = next(iter(scores))
            say(f"eval of model version {version}: {first} = {scores[first]:.4f}")
        return {
            "start": st.main_first(records[0]["scores"]),
            "end": st.main_first(records[-1]["scores"]),
            "by_version": by_version,
        }

    async def _run_bench_explorer(self, *, latest_only: bool) -> list[dict[str, Any]]:
        """Run an explorer in bench mode to its end; the eval records it appended, in order."""
        before = len(st.eval_records(self.cfg))
        child = await self.start(
            "explorer",
            "mode=bench",
            f"explorer.bench_on_latest_checkpoint={str(latest_only).lower()}",
            label="explorer-bench",
            alone=True,
        )
        code = await child.proc.wait()
        await self.stop("explorer-bench")
        if code != 0:
            raise RuntimeError(f"the bench explorer exited with code {code}: {' / '.join(child.tail[-3:])}")
        records = st.eval_records(self.cfg)[before:]
        if not records:
            raise RuntimeError("the bench explorer recorded no eval scores")
        return records

    async def run_workers(self, workers: Sequence[str], *, startup_eval: bool = True) -> int:
        labels: list[str] = []
        for name in workers:
            if not startup_eval and name == "explorer":
                self.overrides[name] = ("explorer.eval_on_startup=false",)
            labels.append(name)
            if name == "explorer":
                for index in range(2, self.cfg.explorer.replicas + 1):
                    label = f"explorer-{index}"
                    self.overrides[label] = replica_overrides(self.cfg, index)
                    self.service_of[label] = "explorer"
                    labels.append(label)
        if {"trainer", "explorer"} <= set(workers):
            await reopen_writers(self.cfg)  # a continued run's explorers closed them last time
        for label in labels:
            child = await self.start(
                self.service_of.get(label, label),
                *self.overrides.get(label, ()),
                label=label,
                alone=self._alone(labels),
            )
            say(f"{label} is SERVING at {child.address}")
        reporter = ProgressReporter(self.cfg, [*workers])
        progress = asyncio.create_task(reporter.run())
        try:
            return await self.watch(labels)
        finally:
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress


async def run_async(config: str | None, overrides: Sequence[str] = (), *, verbose: bool = False) -> int:
    cfg = load_config(config, overrides)
    if not cfg.continue_from_checkpoint:
        cfg = load_config(config, fresh_run_overrides(cfg, overrides))
    root = cfg.run_dir
    preflight(cfg)
    pinned_cpus("")  # a malformed $TRINITY_PIN_CPUS fails here, before any service starts
    prepare_data(cfg)
    summary = st.load_summary(root)
    previous: TrinityConfig | None = None
    previous_entry: dict[str, Any] | None = None
    for index, stage in enumerate(cfg.stage_configs):
        label = cfg.stages[index].stage_name if cfg.stages else st.run_label(cfg)
        user_model = bool(cfg.stages and "model_path" in (cfg.stages[index].model or {}))
        stage = resolve_ports(st.chain_model(stage, previous, user_model))
        carried = (
            previous_entry["eval"].get("end")
            if previous_entry and st.scores_carry_over(stage, previous)
            else None
        )
        previous = stage
        entry = previous_entry = st.stage_entry(summary, label)
        if st.finished(entry, stage) and stage.mode != "bench":  # a bench re-scores what is there now
            say(f"stage {index + 1}/{len(cfg.stage_configs)} {label} already complete; skipping")
            continue
        path = os.path.join(stage.run_dir, "config.resolved.yaml")
        write_resolved_config(stage, path)
        say(
            f"stage {index + 1}/{len(cfg.stage_configs)} {label}: mode {stage.mode}, "
            f"algorithm {stage.algorithm.algorithm_type}, model {stage.model.model_path}, run dir {stage.run_dir}"
        )
        if carried and "start" not in entry["eval"] and stage.mode != "bench":
            entry["eval"]["start"] = dict(carried)  # the same weights, scored the same way: not again
            first = next(iter(carried))
            say(
                f"eval start: {first} = {carried[first]:.4f} (the previous stage's end: same weights and evals)"
            )
        code = await run_watched(
            StageRunner(stage, path, verbose=verbose), entry, lambda: st.save_summary(root, summary)
        )
        if code != 0:
            return code
    print("\n" + st.format_table(summary), flush=True)
    print(f"\nsummary: {st.summary_path(root)}", flush=True)
    if cfg.monitor.monitor_type == "tensorboard":
        print(f"TensorBoard: tensorboard --logdir {root}", flush=True)
    return 0


def run(config: str | None, overrides: Sequence[str] = (), *, verbose: bool = False) -> int:
    loop = asyncio.new_event_loop()
    main = loop.create_task(run_async(config, overrides, verbose=verbose))
    loop.add_signal_handler(signal.SIGINT, main.cancel)
    loop.add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        return loop.run_until_complete(main)
    except asyncio.CancelledError:
        say("interrupted; services stopped (run the same command again to continue)", err=True)
        return 130
    except TrinityError as exc:
        print(f"trinity run: {exc}", file=sys.stderr)
        return 2
    finally:
        loop.close()
