"""The explorer's step loop (gRPC-free): read tasks, sync weights, roll out, process, write, report.

One step:
1. ReadTasks(batch_size) from the training taskset; the buffer persists the cursor per reader, and
   a restarted explorer first asks for the last batch it was handed again (repeat_last), so a step
   killed midway is redone, not lost. Step = batch_index + 1.
2. BeginExplorerStep(step, version held): load the weights the synchronizer names, if any.
3. Run repeat_times rollouts per task (runner: timeouts, retries, skips), stamp ids and version.
4. Experience pipeline (filters, shaping, optional group advantages).
5. Write to the experience buffer in chunks with idempotency keys from (explorer, step, chunk).
6. Pass-rate feedback for difficulty-based task selection; metrics to the monitor; a log line.
Eval runs at start (eval_on_startup, fresh runs only) and every eval_interval steps. At end of
data the explorer closes its writer on the experience buffer so the trainer sees the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import numpy as np

from services.common.config.schema import TrinityConfig
from services.common.errors import AlreadyExists, InvalidArgument
from services.common.experience import Experience
from services.common.experience import Task as WireTask
from services.common.logging import get_logger
from services.common.monitor import peak_rss_mb
from services.explorer.eval import Evaluator
from services.explorer.pipeline import ExperiencePipeline
from services.explorer.pipeline.input_log import PipelineInputLog
from services.explorer.pipeline.step_wise import explorer_side_advantage
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.runner import UnitResult, WorkflowRunner
from services.explorer.weight_sync import WeightSync
from services.explorer.workflows import WORKFLOWS, Task

log = get_logger("explorer")
WRITE_CHUNK = 256


class TaskResolver:
    """Wire tasks -> workflow tasks: looks up the workflow and reward fn the task names.

    Every setting of a task (workflow, reward fn, repeat_times, rollout/format/workflow args) was
    decided once, by services/common/config/tasksets.py, and arrives on the wire from the buffer.
    """

    def __call__(self, wire: WireTask, batch_id: int) -> Task:
        if not wire.workflow:
            raise InvalidArgument(
                f"task {wire.task_id!r} of {wire.taskset!r} names no workflow; set "
                "buffer.explorer_input.taskset.default_workflow_type (e.g. math_workflow)",
                field="buffer.explorer_input.taskset.default_workflow_type",
            )
        return Task.from_wire(
            wire,
            workflow=WORKFLOWS.get(wire.workflow, field="default_workflow_type"),
            reward_fn=REWARD_FUNCTIONS.get(wire.reward_fn, field="default_reward_fn_type")
            if wire.reward_fn
            else None,
            batch_id=batch_id,
        )


def rollout_metrics(results: list[UnitResult], exps: list[Experience], seconds: float) -> dict[str, float]:
    """Step metrics before the pipeline: rewards, lengths, tokens/s, task times, failures."""
    rewards = np.array([e.reward for e in exps if e.reward is not None], dtype=np.float64)
    lengths = np.array([e.response_length for e in exps], dtype=np.float64)
    times = np.array([r.seconds for r in results], dtype=np.float64)
    metrics = {
        "rollout/experiences": float(len(exps)),
        "rollout/reward/mean": float(rewards.mean()) if rewards.size else 0.0,
        "rollout/reward/std": float(rewards.std()) if rewards.size else 0.0,
        "rollout/reward/max": float(rewards.max()) if rewards.size else 0.0,
        "rollout/reward/min": float(rewards.min()) if rewards.size else 0.0,
        "rollout/response_length/mean": float(lengths.mean()) if lengths.size else 0.0,
        "rollout/response_length/max": float(lengths.max()) if lengths.size else 0.0,
        "rollout/tokens_per_s": float(lengths.sum() / seconds) if seconds > 0 else 0.0,
        "rollout/task_time/mean": float(times.mean()) if times.size else 0.0,
        "rollout/task_time/max": float(times.max()) if times.size else 0.0,
        "rollout/timeouts": float(sum(r.timeouts for r in results)),
        "rollout/retries": float(sum(r.retries for r in results)),
        "rollout/skipped": float(sum(r.skipped for r in results)),
        "time/rollout_s": seconds,
    }
    names = {name for e in exps for name in e.metrics}
    for name in sorted(names):
        values = [e.metrics[name] for e in exps if name in e.metrics]
        metrics[f"rollout/{name}/mean"] = float(np.mean(values))
    return metrics


def pass_rates(results: list[UnitResult]) -> dict[str, float]:
    """Per task: mean `accuracy` metric when the workflow reports one, else the share of rewards > 0.

    An accuracy below 0 counts as 0: math_dapo_reward reports -1 for a wrong answer (DAPO's rule).
    """
    outcomes: dict[str, list[float]] = {}
    for result in results:
        bucket = outcomes.setdefault(result.task.task_id, [])
        bucket.extend(
            max(0.0, float(e.metrics["accuracy"]))
            if "accuracy" in e.metrics
            else float((e.reward or 0.0) > 0)
            for e in result.experiences
        )
        if result.skipped:
            bucket.append(0.0)
    return {task_id: float(np.mean(v)) for task_id, v in outcomes.items() if v}


class Explorer:
    """See the module docstring. Clients and engines are injected (tests use fakes or real servers)."""

    def __init__(
        self,
        cfg: TrinityConfig,
        *,
        buffer: Any,
        weights: WeightSync,
        runner: WorkflowRunner,
        monitor: Any,
    ) -> None:
        self.cfg = cfg
        self.name = cfg.explorer.name
        self.buffer = buffer
        self.runner = runner
        self.weights = weights
        self.monitor = monitor
        self.resolve = TaskResolver()
        dp = cfg.data_processor.experience_pipeline
        self.pipeline = ExperiencePipeline.from_config(dp.operators if dp else [])
        advantage = explorer_side_advantage(cfg)
        if advantage is not None:
            self.pipeline.operators.append(advantage)
        self.input_log = PipelineInputLog.from_config(cfg)
        inputs = cfg.buffer.explorer_input
        self.taskset = inputs.taskset
        self.experience_buffer = cfg.buffer.trainer_input.experience_buffer.name
        self.evaluator = Evaluator(
            buffer=buffer,
            runner=runner,
            tasksets=inputs.eval_tasksets,
            resolve=self.resolve,
            reader_id=f"{self.name}-eval",
            batch_size=max(cfg.buffer.batch_size, runner.slots),  # eval tasks fill every runner
        )
        self.step = 0
        self.state = "starting"
        self.written = 0
        self.replayed_step = 0  # the step this process ran again for a killed predecessor (repeat_last)
        self.weights_lock: asyncio.Lock = getattr(weights, "lock", None) or asyncio.Lock()
        self.last_metrics: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}  # the latest eval scores ("eval/<taskset>/<metric>")
        self.last_eval_step = -1

    @property
    def model_version(self) -> int:
        """The version the engines hold; the runner stamps it on every experience."""
        return int(self.runner.version_fn())

    @model_version.setter
    def model_version(self, value: int) -> None:
        self.runner.version_fn.value = value

    # --- weights ---------------------------------------------------------------------------------

    async def sync_before(self, step: int) -> float:
        """Ask the synchronizer; load the version it names. Returns seconds spent."""
        t0 = time.perf_counter()
        self.state = "waiting_for_sync"
        loaded = await self.weights.before_step(step)  # takes weights_lock only while copying weights
        if loaded is not None:
            previous, self.model_version = self.model_version, loaded
            log.info("weights_loaded", step=step, version=loaded, previous=previous)
        return time.perf_counter() - t0

    # --- steps -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Steps until the taskset ends, then close the writer on the experience buffer."""
        if self.taskset is None:
            raise InvalidArgument(
                "explore mode needs buffer.explorer_input.taskset", field="buffer.explorer_input.taskset"
            )
        await self.buffer.open_writer(self.experience_buffer, self.name)
        first = True
        while True:
            self.state = "reading_tasks"
            # The first read repeats the last batch this explorer was handed: a predecessor killed
            # mid-step did not finish it (a finished one is written again with the same idempotency
            # keys, which adds nothing).
            t_tasks = time.perf_counter()
            batch = await self.buffer.read_tasks(
                self.taskset.name, self.cfg.buffer.batch_size, reader_id=self.name, repeat_last=first
            )
            read_tasks_s = time.perf_counter() - t_tasks
            if batch.end_of_data and not batch.tasks:
                break
            step = int(batch.batch_index) + 1
            if first:
                self.replayed_step = step
            if first and step == 1 and self.cfg.explorer.eval_on_startup and self.evaluator.tasksets:
                await self.evaluate(0)
            first = False
            sync_s = await self.sync_before(step)
            if step == self.cfg.buffer.total_steps:  # no later version will be loaded
                await self.weights.leave()
            extra = {
                "time/sync_s": sync_s,
                "time/read_tasks_s": read_tasks_s,
                "rollout/epoch": float(batch.epoch),
            }
            metrics = await self.explore_step(step, batch.tasks, extra=extra)
            t_eval = time.perf_counter()
            if self.evaluator.tasksets and step % self.cfg.explorer.eval_interval == 0:
                await self.evaluate(step)
            metrics["time/eval_s"] = time.perf_counter() - t_eval
            await asyncio.to_thread(self._record_step, step, metrics)
            if batch.end_of_data:
                break
        self.state = "finished"
        await self.buffer.close_writer(self.experience_buffer, self.name)
        log.info(
            "explorer_finished", steps=self.step, experiences=self.written, model_version=self.model_version
        )

    async def explore_step(
        self, step: int, wire_tasks: list[WireTask], extra: dict[str, float] | None = None
    ) -> dict[str, float]:
        self.state = "exploring"
        t0 = time.perf_counter()
        tasks = [self.resolve(w, step) for w in wire_tasks]
        results = await self.runner.run_tasks(tasks)
        rollout_s = time.perf_counter() - t0
        exps: list[Experience] = []
        for result in results:
            for exp in result.experiences:
                exp.group_id = f"{self.name}/{step}/{result.task.taskset}/{exp.task_id}"
                exp.batch_id, exp.producer = step, self.name
                exps.append(exp)
        metrics = rollout_metrics(results, exps, rollout_s)
        if self.input_log is not None:
            await asyncio.to_thread(self.input_log.append, step, exps)
        exps, pipeline_metrics = self.pipeline.process(exps)
        t_write = time.perf_counter()
        await self.write(step, exps)
        metrics.update(pipeline_metrics)
        metrics.update(extra or {})
        metrics.update(
            {
                "rollout/model_version": float(self.model_version),
                "rollout/written": float(len(exps)),
                "time/write_s": time.perf_counter() - t_write,
                "time/step_s": time.perf_counter() - t0,
                "memory/peak_rss_mb": peak_rss_mb(),
            }
        )
        await self.report_feedback(results)
        self.step, self.last_metrics = step, metrics
        self.monitor.log(metrics, step)
        log.info(
            "explore_step",
            step=step,
            reward_mean=round(metrics["rollout/reward/mean"], 4),
            tokens_per_s=round(metrics["rollout/tokens_per_s"], 1),
            model_version=self.model_version,
            experiences=len(exps),
            skipped=int(metrics["rollout/skipped"]),
            step_s=round(metrics["time/step_s"], 3),
        )
        return metrics

    async def write(self, step: int, exps: list[Experience]) -> None:
        """Chunks with deterministic idempotency keys: a retry or a replayed step writes nothing twice.

        A replayed step's rollouts differ from those its killed predecessor wrote under the same
        keys (sampling), which the buffer refuses (AlreadyExists): the predecessor's chunks stand
        and the rerun's copies of them are dropped. Outside a replay that error is a real key clash
        (two explorers with one name) and is raised."""
        chunk = min(WRITE_CHUNK, self.cfg.buffer.max_batch_items)
        for part, start in enumerate(range(0, len(exps), chunk)):
            key = f"{self.name}:{self.taskset.name if self.taskset else ''}:step{step}:part{part}"
            exps_part = exps[start : start + chunk]
            try:
                await self.buffer.write(
                    self.experience_buffer, exps_part, idempotency_key=key, writer_id=self.name
                )
            except AlreadyExists:
                if step != self.replayed_step:
                    raise
                log.warning("replayed_chunk_written_before", step=step, part=part, dropped=len(exps_part))
                continue
            self.written += len(exps_part)

    async def report_feedback(self, results: list[UnitResult]) -> None:
        if self.taskset is None or self.taskset.selector.selector_type != "difficulty_based":
            return
        rates = pass_rates(results)
        if rates:
            await self.buffer.report_task_feedback(self.taskset.name, rates)

    async def evaluate(self, step: int, names: list[str] | None = None) -> dict[str, float]:
        async with self.weights_lock:
            previous, self.state, began = self.state, "evaluating", time.perf_counter()
            try:
                scores = await self.evaluator.evaluate(step, names)
            finally:
                self.state = previous
        eval_s = time.perf_counter() - began
        if scores:
            self.last_eval, self.last_eval_step = dict(scores), step
            self.monitor.log({**scores, "eval/model_version": float(self.model_version)}, step)
            await asyncio.to_thread(self._record_eval, step, scores, eval_s)
        return scores

    def _record_step(self, step: int, metrics: dict[str, float]) -> None:
        """Append the step's timings to <run dir>/explorer/progress-<name>.jsonl (summary.json's
        phase breakdown, cli/phases.py)."""
        record = {
            "time": time.time(),
            "step": step,
            "metrics": {k: v for k, v in metrics.items() if k.startswith(("time/", "memory/"))},
        }
        path = os.path.join(self.cfg.run_dir, "explorer", f"progress-{self.name}.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def _record_eval(self, step: int, scores: dict[str, float], eval_s: float) -> None:
        """Append to <run dir>/eval/results.jsonl: `trinity run` builds summary.json from it."""
        record = {
            "time": time.time(),
            "explorer": self.name,
            "mode": self.cfg.mode,
            "step": step,
            "model_version": self.model_version,
            "eval_s": round(eval_s, 3),
            "scores": scores,
        }
        path = os.path.join(self.cfg.run_dir, "eval", "results.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    async def bench(self, checkpoints: list[tuple[int, str]]) -> dict[int, dict[str, float]]:
        """bench mode: evaluate each checkpoint in order (the current weights when there is none)."""
        if not checkpoints:
            return {self.model_version: await self.evaluate(self.model_version)}
        out = {}
        for version, path in checkpoints:
            await self.weights.load_path(version, path)
            self.model_version = version
            out[version] = await self.evaluate(version)
        return out
