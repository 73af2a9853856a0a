"""Streaming writes: each group of an explorer step goes to the experience buffer once it is complete.

A group is what one task of the step's batch gives: its repeat_times rollouts (every runner unit
of the task; a workflow that files some experiences under a task of its own, such as RULER's
judgements, adds them to the same write). When every pipeline operator is group-local
(`ExperienceOperator.group_local`: all built-ins, except step_wise_grpo with std_cal_level
"batch"), the pipeline runs on each group as soon as its last unit finishes and what it keeps is
written at once, while the step's other tasks still generate: the trainer, which starts a step
as soon as train_batch_size rows are in the buffer (services/trainer/reading.py), need not wait
for the explorer's step to end. An operator that is not group-local (a user operator that does
not declare it) sees the whole batch of tasks, as in Trinity: the pipeline then runs once per
batch, after its last group, and the groups are written after that (log `streaming_writes_off`).

Idempotency keys name (explorer, taskset, step, round, group, chunk):
`<explorer>:<taskset>:step<s>:round<r>:group<i>:part<j>`, i the task's position in the round's
batch (a replayed step is handed the same batch and the same extensions by the buffer), j a chunk
of buffer.max_batch_items when a group is larger. A retried write adds nothing; the rerun of the
step a killed explorer was on (repeat_last) samples other rollouts, so the buffer refuses the
groups its predecessor wrote (AlreadyExists, log `replayed_group_written_before`): those stand,
and the rerun writes the others. Outside a replay that error is a real clash (two explorers with
one name) and is raised.

Dynamic sampling (refill.py): the rounds after the first may overshoot buffer.batch_size groups.
Their groups are released in task order (a finished group waits for those before it in its
round), the first that fit are written and the rest are the surplus (`refill_surplus`): the same
groups, in the same order, a rerun would keep.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.common.errors import AlreadyExists
from services.common.experience import Experience
from services.common.logging import get_logger
from services.explorer.pipeline import ExperiencePipeline
from services.explorer.pipeline.operators import PipelineOutput
from services.explorer.refill import SURPLUS, RolloutRow, group_ids, merge_round_metrics

log = get_logger("explorer.writes")


class GroupWriter:
    """Writes one group under its idempotency keys; counts what the buffer took."""

    def __init__(self, buffer: Any, *, buffer_name: str, explorer: str, taskset: str, chunk: int) -> None:
        self.buffer = buffer
        self.buffer_name = buffer_name
        self.explorer = explorer
        self.taskset = taskset
        self.chunk = max(1, chunk)
        self.written = 0
        self.replayed_step = 0  # the step this process runs again for a killed predecessor

    def key(self, step: int, round_index: int, group: int, part: int) -> str:
        return f"{self.explorer}:{self.taskset}:step{step}:round{round_index}:group{group}:part{part}"

    async def write(self, step: int, round_index: int, group: int, exps: list[Experience]) -> None:
        for part, start in enumerate(range(0, len(exps), self.chunk)):
            rows = exps[start : start + self.chunk]
            key = self.key(step, round_index, group, part)
            try:
                await self.buffer.write(self.buffer_name, rows, idempotency_key=key, writer_id=self.explorer)
            except AlreadyExists:
                if step != self.replayed_step:
                    raise
                log.warning("replayed_group_written_before", step=step, key=key, dropped=len(rows))
                continue
            self.written += len(rows)


@dataclass
class StepBudget:
    """The groups one step writes: at most `wanted` in its refill rounds (None: no cap)."""

    wanted: int | None
    kept: int = 0


class RoundWrites:
    """One round (a batch of tasks) of a step: each finished group through the pipeline and out."""

    def __init__(
        self,
        pipeline: ExperiencePipeline,
        writer: GroupWriter,
        *,
        step: int,
        round_index: int,
        budget: StepBudget,
        input_log: Callable[[list[Experience]], Any] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.writer = writer
        self.step = step
        self.round_index = round_index
        self.budget = budget
        self.capped = round_index > 0 and budget.wanted is not None
        self.streaming = not pipeline.batch_level
        self.input_log = input_log
        self.rows: list[RolloutRow] = []
        self.kept: list[Experience] = []
        self.dropped: Counter[str] = Counter()
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.pending: dict[int, list[Experience]] = {}
        self.next_group = 0  # capped rounds release groups in task order

    async def group_done(self, group: int, exps: list[Experience]) -> None:
        """Task `group`'s experiences (stamped, before the pipeline), as soon as all its units ended."""
        self.rows.extend(RolloutRow.of(e) for e in exps)
        if self.input_log is not None:
            await self.input_log(exps)
        self.pending[group] = exps
        if not self.streaming:
            return
        if not self.capped:
            await self._process(group, self.pending.pop(group))
            return
        while self.next_group in self.pending:
            await self._process(self.next_group, self.pending.pop(self.next_group))
            self.next_group += 1

    async def finish(self) -> PipelineOutput:
        """After the round's last group: a batch-level pipeline runs now, over the round's groups."""
        if not self.streaming and self.pending:
            order = sorted(self.pending)
            owner = {e.group_id: g for g in order for e in self.pending[g]}
            out = self.pipeline.run([e for g in order for e in self.pending[g]])
            self.dropped.update(out.dropped)
            self.metrics.append((sum(len(v) for v in self.pending.values()), out.metrics))
            by_group: dict[int, list[Experience]] = {}
            for exp in out.experiences:  # an experience an operator made up joins the last group
                by_group.setdefault(owner.get(exp.group_id, order[-1]), []).append(exp)
            for group in sorted(by_group):
                await self._admit(group, by_group[group])
        metrics = merge_round_metrics(self.metrics) if self.metrics else {}
        return PipelineOutput(self.kept, metrics, self.dropped)

    async def _process(self, group: int, exps: list[Experience]) -> None:
        if not exps:  # a skipped task: nothing to process or write
            return
        out = self.pipeline.run(exps)
        self.dropped.update(out.dropped)
        self.metrics.append((len(exps), out.metrics))
        await self._admit(group, out.experiences)

    async def _admit(self, group: int, exps: list[Experience]) -> None:
        if not exps:
            return
        wanted = self.budget.wanted
        if self.capped and wanted is not None and self.budget.kept >= wanted:
            self.dropped[SURPLUS] += len(exps)
            return
        self.budget.kept += len(group_ids(exps))
        await self.writer.write(self.step, self.round_index, group, exps)
        self.kept.extend(exps)
