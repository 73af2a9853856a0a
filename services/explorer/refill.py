"""Dynamic sampling's refill: one explorer step keeps sampling until it has buffer.batch_size groups.

DAPO (arXiv:2503.14476, Sec. 3.2, Algorithm 1) over-samples: groups whose rollouts are all right
or all wrong are dropped (`dapo_dynamic_sampling`), and generation goes on until the batch is full
of groups that carry a signal. veRL does it with generation batches (`max_num_gen_batches` of
them at most, `algorithm.filter_groups`); Trinity-RFT v0.6 does not refill: its explorer writes what
the filter kept and its trainer waits for later steps' experiences, which under a one-step sync
plan can stall the two against each other. Here, when the pipeline has a refilling operator
(`ExperienceOperator.refill`), the explorer reads further task batches of buffer.batch_size within
the same step (the buffer's `ReadTasks(extend=true)`: same batch index, so a restarted explorer
that repeats the step reads the same extensions again), runs and filters each one (a round), and
stops when the kept groups reach buffer.batch_size, when the taskset ends, or after
`explorer.max_num_gen_batches` rounds in all (0: no limit). The round that overshoots gives up its
last groups (`refill_surplus` in the drop counts), as veRL trims its batch, so the step writes
exactly buffer.batch_size groups: the trainer, reading train_batch_size experiences, gets full
batches of one step's groups in every sync mode. When the cap or the end of the taskset comes
first, the step writes what it has (log `refill_cap_reached` / `refill_taskset_ended`, metric
`rollout/refill_cap_reached`), and the trainer's batch takes the rest from the next step. Not so
where the explorer's steps wait for versions trained on its rows (`must_fill`: every sync_style
but fully_async, with a trainer): the trainer would wait for rows the explorer samples only after
that version, a stall until the trainer's leases run out (seen on SmolLM2 on-policy: 11 minutes,
and the reclaimed rows read twice into one batch; with sync_offset 1 the wait comes a step later). There the cap is logged and sampling goes on until the step is full or the
taskset ends (a short last step ends the data: the buffer tells the trainer, which trains it).

Each round's pipeline metrics are combined into the step's: counts (`*count`, `dropped_*`,
`filtered_groups`, `tasks`, step_wise_grpo's `runs`) add up, other metrics are averaged weighted by
the round's experiences. Streaming writes (writes.py) combine each group's metrics the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.common.experience import Experience
from services.common.logging import get_logger
from services.explorer.pipeline.operators import PipelineOutput

log = get_logger("explorer.refill")
SURPLUS = "refill_surplus"
ADDITIVE = ("filtered_groups", "tasks", "runs")


@dataclass(frozen=True)
class RolloutRow:
    """What the step's rollout metrics read of an experience, taken before the pipeline changes it."""

    reward: float | None
    response_length: int
    metrics: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)
    """The info keys step metrics count: prompt_overlong, truncate_status (explorer/prompt_fit.py)."""

    @classmethod
    def of(cls, exp: Experience) -> RolloutRow:
        info: dict[str, Any] = {
            k: exp.info[k] for k in ("prompt_overlong", "truncate_status") if k in exp.info
        }
        return cls(exp.reward, exp.response_length, dict(exp.metrics), info)


@dataclass
class Round:
    """One batch of tasks run and filtered: runner results, rollouts as sampled, the pipeline's output."""

    results: list[Any]
    rows: list[RolloutRow]
    output: PipelineOutput
    seconds: float


@dataclass
class SampledStep:
    """A step's rounds put together: what to write, and what it took."""

    rounds: list[Round]
    experiences: list[Experience]
    dropped: Counter[str] = field(default_factory=Counter)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def results(self) -> list[Any]:
        return [r for rnd in self.rounds for r in rnd.results]

    @property
    def rows(self) -> list[RolloutRow]:
        return [row for rnd in self.rounds for row in rnd.rows]

    @property
    def rollout_seconds(self) -> float:
        return sum(rnd.seconds for rnd in self.rounds)


def lockstep(cfg: Any) -> bool:
    """Whether the explorer's steps wait for versions trained on its rows (sample_step's
    `must_fill`): every sync_style but fully_async, with a trainer. With sync_offset k the wait
    comes k steps later, but comes: steps that each stop short leave the trainer without a batch
    when the explorer waits for the version that batch would make."""
    return bool(cfg.synchronizer.sync_style != "fully_async" and cfg.mode != "explore")


def group_ids(exps: Sequence[Experience]) -> list[str]:
    """Distinct groups in order of first appearance (group id, else task id, as the operators)."""
    return list(dict.fromkeys(e.group_id or e.task_id for e in exps))


def keep_groups(exps: list[Experience], most: int) -> list[Experience]:
    """The experiences of the first `most` groups (in order of first appearance)."""
    kept = set(group_ids(exps)[:most])
    return [e for e in exps if (e.group_id or e.task_id) in kept]


def merge_round_metrics(rounds: Sequence[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Rounds' pipeline metrics, (experiences in, metrics) each: counts add, the rest is averaged."""
    if len(rounds) == 1:
        return dict(rounds[0][1])
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for _, metrics in rounds for k in metrics):
        name = key.rsplit("/", 1)[-1]
        present = [(n, m[key]) for n, m in rounds if key in m]
        if name.endswith("count") or name.startswith("dropped_") or name in ADDITIVE:
            out[key] = float(sum(v for _, v in present))
        else:
            weight = sum(n for n, _ in present)
            out[key] = float(sum(n * v for n, v in present) / weight) if weight else present[-1][1]
    return out


async def sample_step(
    first: Round,
    *,
    more: Callable[[int], Awaitable[Round | None]],
    wanted: int,
    max_rounds: int,
    step: int,
    must_fill: bool = False,
) -> SampledStep:
    """Run rounds after `first` (`more(i)`: round i, None at the end of the taskset) until the kept
    groups reach `wanted` or `max_rounds` rounds ran (0: no limit; 1: no refill); `must_fill`: the
    cap is logged and passed, only the end of the taskset stops a step short."""
    rounds = [first]
    kept = len(group_ids(first.output.experiences))
    cap_reached = ended = False
    refill = max_rounds != 1 or must_fill
    while kept < wanted and refill:
        if max_rounds and len(rounds) >= max_rounds and not cap_reached:
            cap_reached = True
            if not must_fill:
                break
            log.warning(
                "refill_cap_passed",
                step=step,
                groups=kept,
                wanted=wanted,
                gen_batches=len(rounds),
                hint="the explorer waits for versions trained on its rows (sync_style not fully_async), so "
                "a short step would stall the trainer: sampling goes on until the step is full; the tasks "
                "may be too easy or too hard for the model",
            )
        nxt = await more(len(rounds))
        if nxt is None:
            ended = True
            break
        rounds.append(nxt)
        kept += len(group_ids(nxt.output.experiences))
    sampled = SampledStep(rounds, [e for rnd in rounds for e in rnd.output.experiences])
    for rnd in rounds:
        sampled.dropped.update(rnd.output.dropped)
    if len(rounds) > 1 and kept > wanted:  # only the last round overshoots: give up its last groups
        trimmed = keep_groups(sampled.experiences, wanted)
        sampled.dropped[SURPLUS] += len(sampled.experiences) - len(trimmed)
        sampled.experiences, kept = trimmed, wanted
    sampled.metrics = merge_round_metrics([(len(r.rows), r.output.metrics) for r in rounds])
    if refill:
        sampled.metrics.update(
            {
                "rollout/num_gen_batches": float(len(rounds)),
                "rollout/groups": float(kept),
                "rollout/refill_cap_reached": float(cap_reached),
            }
        )
    if cap_reached and not must_fill:
        log.warning(
            "refill_cap_reached",
            step=step,
            groups=kept,
            wanted=wanted,
            gen_batches=len(rounds),
            hint="the step writes fewer groups than buffer.batch_size; raise explorer.max_num_gen_batches "
            "(0: no limit), or the tasks are too easy or too hard for the model",
        )
    elif ended and kept < wanted:
        log.info("refill_taskset_ended", step=step, groups=kept, wanted=wanted, gen_batches=len(rounds))
    for reason, n in sampled.dropped.items():
        sampled.metrics[f"rollout/dropped/{reason}"] = float(n)
    return sampled
