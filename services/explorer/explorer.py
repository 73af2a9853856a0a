"""The explorer's step loop (gRPC-free): read tasks, sync weights, roll out, process, write, report.

One step:
1. ReadTasks(batch_size) from the training taskset (or the mix of buffer.explorer_input.tasksets,
   services/buffer/kinds/mix.py: each task keeps its own set's workflow and reward fn); the buffer persists the cursor per reader, and
   a restarted explorer first asks for the last batch it was handed again (repeat_last), so a step
   killed midway is redone, not lost. Step = batch_index + 1.
2. BeginExplorerStep(step, version held): load the weights the synchronizer names, if any. Under
   fully_async a version published during the step may load between two tokens (mid_step.py).
3. Run repeat_times rollouts per task (runner: timeouts, retries, skips), stamp ids and version.
4-5. Experience pipeline (filters, shaping, optional group advantages). With dynamic sampling
   (dapo_dynamic_sampling) 3-5 repeat on further task batches of the same step until it has
   buffer.batch_size groups (refill.py; the buffer hands them as extensions of the step's batch).
   Each group (one task's rollouts) goes through the pipeline and to the experience buffer as soon
   as it is complete, under idempotency keys from (explorer, step, round, group) (writes.py).
6. Pass-rate feedback for difficulty-based task selection; metrics to the monitor; a log line;
   the step's timings and pipeline drops to <run dir>/explorer/progress-<name>.jsonl.
Eval runs at start (eval_on_startup, fresh runs only) and every eval_interval steps. At end of
data the explorer closes its writer on the experience buffer so the trainer sees the end.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from typing import Any

from services.common.config.schema import TrinityConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.common.experience import Task as WireTask
from services.common.logging import get_logger
from services.common.monitor import peak_rss_mb
from services.explorer import records
from services.explorer.eval import Evaluator
from services.explorer.mid_step import partial_rows
from services.explorer.pipeline import ExperiencePipeline
from services.explorer.pipeline.input_log import PipelineInputLog
from services.explorer.pipeline.step_wise import explorer_side_advantage
from services.explorer.refill import Round, lockstep, sample_step
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.runner import UnitResult, WorkflowRunner
from services.explorer.step_metrics import pass_rates, rollout_metrics
from services.explorer.weight_sync import WeightSync
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.writes import GroupWriter, RoundWrites, StepBudget

log = get_logger("explorer")
WRITE_CHUNK = 256


class TaskResolver:
    """Wire tasks -> workflow tasks: looks up the workflow and reward fn the task names.

    Every setting of a task (workflow, reward fn, repeat_times, rollout/format/workflow args) was
    decided once, by services/common/config/tasksets.py, and arrives on the wire from the buffer.
    `keys` maps a taskset's name to its config key, for errors (default: the one training taskset).
    """

    def __init__(self, keys: dict[str, str] | None = None) -> None:
        self.keys = keys or {}

    @classmethod
    def from_config(cls, cfg: TrinityConfig) -> TaskResolver:
        inputs = cfg.buffer.explorer_input
        keys = {ts.name or "taskset": key for key, ts in inputs.training_tasksets()}
        keys |= {
            ts.name: f"buffer.explorer_input.eval_tasksets[{i}]" for i, ts in enumerate(inputs.eval_tasksets)
        }
        return cls(keys)

    def __call__(self, wire: WireTask, batch_id: int) -> Task:
        if not wire.workflow:
            key = self.keys.get(wire.taskset, "buffer.explorer_input.taskset") + ".default_workflow_type"
            raise InvalidArgument(
                f"task {wire.task_id!r} of {wire.taskset!r} names no workflow; set {key} "
                "(e.g. math_workflow) or buffer.explorer_input.default_workflow_type",
                field=key,
            )
        return Task.from_wire(
            wire,
            workflow=WORKFLOWS.get(wire.workflow, field="default_workflow_type"),
            reward_fn=REWARD_FUNCTIONS.get(wire.reward_fn, field="default_reward_fn_type")
            if wire.reward_fn
            else None,
            batch_id=batch_id,
        )


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
        self.resolve = TaskResolver.from_config(cfg)
        dp = cfg.data_processor.experience_pipeline
        self.pipeline = ExperiencePipeline.from_config(dp.operators if dp else [])
        advantage = explorer_side_advantage(cfg)
        if advantage is not None:
            self.pipeline.operators.append(advantage)
        self.input_log = PipelineInputLog.from_config(cfg)
        inputs = cfg.buffer.explorer_input
        self.taskset = inputs.training_reader  # "" when explore mode has nothing to read
        self.feedback_sets = {  # tasksets that choose their tasks by the pass rates the explorer reports
            (ts.name or "taskset")
            for _key, ts in inputs.training_tasksets()
            if ts.selector.selector_type == "difficulty_based"
        }
        self.experience_buffer = cfg.buffer.trainer_input.experience_buffer.name
        self.pack_train = self.pack_eval = None
        if cfg.cod is not None:  # Connect-the-Dots: each batch's tasks run as packs (workflows/cod/pack.py)
            from services.explorer.workflows.cod.pack import pack_tasks

            self.pack_train = functools.partial(pack_tasks, cod=cfg.cod, is_eval=False)
            self.pack_eval = functools.partial(pack_tasks, cod=cfg.cod, is_eval=True)
        self.evaluator = Evaluator(
            buffer=buffer,
            runner=runner,
            tasksets=inputs.eval_tasksets,
            resolve=self.resolve,
            pack=self.pack_eval,
            reader_id=f"{self.name}-eval",
            batch_size=max(cfg.buffer.batch_size, runner.slots),  # eval tasks fill every runner
        )
        self.writer = GroupWriter(
            buffer,
            buffer_name=self.experience_buffer,
            explorer=self.name,
            taskset=self.taskset,
            chunk=min(WRITE_CHUNK, cfg.buffer.max_batch_items),
        )
        if self.pipeline.batch_level:
            log.info(
                "streaming_writes_off",
                operators=self.pipeline.batch_level,
                why="these operators see a whole batch of tasks: groups are written after the batch",
            )
        self.step = 0
        self.state = "starting"
        self.weights_lock: asyncio.Lock = getattr(weights, "lock", None) or asyncio.Lock()
        self.last_metrics: dict[str, float] = {}
        self.last_dropped: Counter[str] = Counter()  # the last step's pipeline drops, by reason
        self.last_partial: list[dict[str, Any]] = []  # the last step's rows of several versions
        self.refill_read_s = 0.0  # the step's extension reads (refill), part of its read_tasks time
        self.write_tail_s = 0.0  # the step's writes after its rounds' last rollouts (not streamed)
        self.last_eval: dict[str, float] = {}  # the latest eval scores ("eval/<taskset>/<metric>")
        self.last_eval_step = -1

    @property
    def written(self) -> int:
        """Experiences this process wrote (not counting those a killed predecessor had written)."""
        return self.writer.written

    @property
    def replayed_step(self) -> int:
        """The step this process ran again for a killed predecessor (repeat_last); 0: none."""
        return self.writer.replayed_step

    @replayed_step.setter
    def replayed_step(self, step: int) -> None:
        self.writer.replayed_step = step

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

    def _loaded_mid_step(self, version: int) -> None:
        self.model_version = version  # the engines hold it (weight_sync logs the load)

    # --- steps -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Steps until the taskset ends, then close the writer on the experience buffer."""
        if not self.taskset:
            raise InvalidArgument(
                "explore mode needs buffer.explorer_input.taskset (or tasksets)",
                field="buffer.explorer_input.taskset",
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
                self.taskset, self.cfg.buffer.batch_size, reader_id=self.name, repeat_last=first
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
            await asyncio.to_thread(
                records.record_step,
                self.cfg.run_dir,
                self.name,
                step,
                metrics,
                dict(self.last_dropped),
                self.last_partial,
            )
            if batch.end_of_data:
                break
        self.state = "finished"
        await self.buffer.close_writer(self.experience_buffer, self.name)
        log.info(
            "explorer_finished", steps=self.step, experiences=self.written, model_version=self.model_version
        )

    async def run_round(self, step: int, wire_tasks: list[WireTask], index: int, budget: StepBudget) -> Round:
        """Roll out one batch of the step's tasks; each group goes through the pipeline and to the
        buffer as soon as its rollouts are done (writes.py). Round i > 0 of a refilled step files
        its groups apart (`<step>.<i>`): a task read twice is two groups."""
        t0 = time.perf_counter()
        label = f"{step}.{index}" if index else str(step)
        log_input = self.input_log

        async def append_input(exps: list[Experience]) -> None:
            assert log_input is not None
            await asyncio.to_thread(log_input.append, step, exps)

        writes = RoundWrites(
            self.pipeline,
            self.writer,
            step=step,
            round_index=index,
            budget=budget,
            input_log=append_input if log_input is not None else None,
        )

        async def group_done(task_index: int, results: list[UnitResult]) -> None:
            exps: list[Experience] = []
            for result in results:
                for exp in result.experiences:
                    exp.group_id = f"{self.name}/{label}/{result.task.taskset}/{exp.task_id}"
                    exp.batch_id, exp.producer = step, self.name
                    exps.append(exp)
            await writes.group_done(task_index, exps)

        tasks = [self.resolve(w, step) for w in wire_tasks]
        if self.pack_train is not None:
            tasks = self.pack_train(tasks)
        results = await self.runner.run_tasks(tasks, on_task=group_done)
        seconds = time.perf_counter() - t0  # with the writes streamed while tasks still ran
        t_write = time.perf_counter()
        output = await writes.finish()
        self.write_tail_s += time.perf_counter() - t_write
        return Round(results, writes.rows, output, seconds)

    async def refill_round(self, step: int, index: int, budget: StepBudget) -> Round | None:
        """Round `index` of step `step` on the next tasks of the step's batch; None: the taskset ended."""
        t0 = time.perf_counter()
        more = await self.buffer.read_tasks(
            self.taskset, self.cfg.buffer.batch_size, reader_id=self.name, extend=True
        )
        self.refill_read_s += time.perf_counter() - t0
        return await self.run_round(step, more.tasks, index, budget) if more.tasks else None

    async def explore_step(
        self, step: int, wire_tasks: list[WireTask], extra: dict[str, float] | None = None
    ) -> dict[str, float]:
        self.state = "exploring"
        t0, self.refill_read_s, self.write_tail_s = time.perf_counter(), 0.0, 0.0
        budget = StepBudget(self.cfg.buffer.batch_size if self.pipeline.refills else None)
        loads = self.weights.during_step(step, self._loaded_mid_step)  # partial rollouts (mid_step.py)
        try:
            sampled = await sample_step(
                await self.run_round(step, wire_tasks, 0, budget),
                more=lambda index: self.refill_round(step, index, budget),
                wanted=self.cfg.buffer.batch_size,
                max_rounds=self.cfg.explorer.max_num_gen_batches if self.pipeline.refills else 1,
                must_fill=self.pipeline.refills and lockstep(self.cfg),
                step=step,
            )
        finally:
            loaded_mid_step = await loads.close()
        exps = sampled.experiences
        self.last_partial = partial_rows(exps)
        metrics = rollout_metrics(sampled.results, sampled.rows, sampled.rollout_seconds)
        metrics.update(sampled.metrics)
        metrics.update(extra or {})
        metrics.update(
            {
                "time/read_tasks_s": metrics.get("time/read_tasks_s", 0.0) + self.refill_read_s,
                "rollout/model_version": float(self.model_version),
                "rollout/written": float(len(exps)),
                "rollout/mid_step_loads": float(len(loaded_mid_step)),
                "rollout/partial_rows": float(len(self.last_partial)),
                "time/write_s": self.write_tail_s,
                "time/step_s": time.perf_counter() - t0,
                "memory/peak_rss_mb": peak_rss_mb(),
            }
        )
        await self.report_feedback(sampled.results)
        self.step, self.last_metrics, self.last_dropped = step, metrics, sampled.dropped
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
            **({"gen_batches": len(sampled.rounds)} if len(sampled.rounds) > 1 else {}),
        )
        return metrics

    async def report_feedback(self, results: list[UnitResult]) -> None:
        """Pass rates to each difficulty_based taskset, for the tasks it handed out."""
        for name in sorted(self.feedback_sets):
            rates = pass_rates([r for r in results if r.task.taskset == name])
            if rates:
                await self.buffer.report_task_feedback(name, rates)

    async def evaluate(self, step: int, names: list[str] | None = None) -> dict[str, float]:
        async with self.weights_lock:
            previous, self.state, began = self.state, "evaluating", time.perf_counter()
            try:
                scores = await self.evaluator.evaluate(step, names)
                answers = self.evaluator.last_answers
            finally:
                self.state = previous
        eval_s = time.perf_counter() - began
        if scores:
            self.last_eval, self.last_eval_step = dict(scores), step
            self.monitor.log({**scores, "eval/model_version": float(self.model_version)}, step)
            head = {"explorer": self.name, "mode": self.cfg.mode, "step": step}
            head["model_version"] = self.model_version
            await asyncio.to_thread(records.record_eval, self.cfg.run_dir, head, scores, eval_s, answers)
        return scores

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
