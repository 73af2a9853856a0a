"""The sync plan as pure functions: when an explorer must sync, when the trainer publishes.

Trinity-RFT's semantics (see DESIGN.md, "Synchronizer semantics"):

- `model_version` is the trainer step whose weights are published; 0 is the base model.
- fixed: the trainer publishes after step t when t % I == 0. The explorer syncs after its step s
  when s > O and (s - O) % I == 0, to version k*I where s = O + k*I (O is its head start).
  Example I=2, O=1: explorer 1,2,3 | sync v2 | 4,5 | sync v4 …; trainer 1,2 | publish v2 | 3,4 | v4.
  Under nccl the trainer waits in its broadcast until the explorers reach the sync point, so they
  get exactly k*I; under checkpoint the explorer loads the newest version >= k*I (newer only when
  the trainer ran ahead, e.g. with sync_offset >= sync_interval).
- dynamic_by_trainer: the trainer publishes every I steps; explorers pick a new version up at
  their next step boundary and are never held for it.
- dynamic_by_explorer: an explorer that ran I steps since its last sync asks for one; the trainer
  publishes at the end of its next step; the explorer loads it at the boundary after that and is
  never held for it (it keeps exploring while the trainer catches up).
- fully_async (Trinity v0.6): the trainer publishes every T = trainer_sync_interval steps and never
  waits for an explorer; each explorer, every E = explorer_sync_interval steps since its last sync,
  loads the newest version at its step boundary if there is a newer one, and is never held for it.
  Example T=2, E=3, trainer ahead: trainer 1,2 | v2 | 3,4 | v4 …; explorer 1,2,3 | load v2 | 4,5,6 |
  load v6 (or whatever is newest then). Under checkpoint nobody waits; under nccl a version's
  group holds the explorers that check at their next boundary (or asked), so the trainer's
  broadcast waits at most for them to finish their current step.
  Partial rollouts: under checkpoint, a check that is due stays open through the step it precedes:
  a version published while the step generates is loaded then, between two tokens, by explorers
  whose engines can (load_during_step); the load counts as that step's boundary sync (the ledger
  records it with the steps done before it), so explorer_sync_interval spaces loads as before.
- max_staleness M: explorer step s would be trained at step `max(s, trainer_done + 1)` (one batch
  per step, as in Trinity's one-explorer default; with several explorers the real step is later,
  so the bound errs on the strict side only for the trainer-faster case); it may start only if the
  version it holds is >= that step - M.

Nothing here is async or stateful; `core.py` keeps the state and the waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.common.config.synchronizer import SynchronizerConfig

STYLES = ("fixed", "dynamic_by_trainer", "dynamic_by_explorer", "fully_async")
STYLE_ALIASES = {"trainer_driven": "dynamic_by_trainer", "explorer_driven": "dynamic_by_explorer"}


@dataclass(frozen=True)
class Plan:
    """The configured plan (intervals in steps, timeout in seconds)."""

    interval: int = 1
    offset: int = 0
    timeout: float = 3600.0
    style: str = "fixed"
    method: str = "nccl"
    max_staleness: int | None = None
    explorer_interval: int = 0
    """fully_async: explorer steps between checks for a newer version (0: `interval`)."""
    trainer_interval: int = 0
    """fully_async: trainer steps between publishes (0: `interval`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "style", STYLE_ALIASES.get(self.style, self.style))
        if self.style not in STYLES:
            raise ValueError(f"sync_style {self.style!r} is not one of {STYLES}")
        if (
            self.interval < 1
            or self.offset < 0
            or (self.max_staleness is not None and self.max_staleness < 1)
            or self.explorer_interval < 0
            or self.trainer_interval < 0
        ):
            raise ValueError(
                "sync_interval must be >= 1, sync_offset >= 0, max_staleness >= 1 or None, "
                "explorer/trainer_sync_interval >= 1 (0: sync_interval)"
            )

    @classmethod
    def from_config(cls, cfg: SynchronizerConfig) -> Plan:
        return cls(
            interval=cfg.sync_interval,
            offset=cfg.sync_offset,
            timeout=cfg.sync_timeout,
            style=cfg.normalized_style,
            method=cfg.method,
            max_staleness=cfg.max_staleness,
            explorer_interval=cfg.explorer_sync_interval or 0,
            trainer_interval=cfg.trainer_sync_interval or 0,
        )

    @property
    def explorer_every(self) -> int:
        """Explorer steps between syncs under fully_async (explorer_sync_interval or sync_interval)."""
        return self.explorer_interval or self.interval

    @property
    def trainer_every(self) -> int:
        """Trainer steps between publishes under fully_async (trainer_sync_interval or sync_interval)."""
        return self.trainer_interval or self.interval


def is_explorer_sync_point(plan: Plan, step: int) -> bool:
    """fixed: does the explorer sync after finishing `step`?"""
    return step > plan.offset and (step - plan.offset) % plan.interval == 0


def fixed_required_version(plan: Plan, step: int) -> int:
    """fixed: the version the explorer must have synced to before running `step` (1-based).

    The last sync point before `step` is s = O + k*I <= step - 1; it brings version k*I.
    """
    done = step - 1
    if done <= plan.offset:
        return 0
    return ((done - plan.offset) // plan.interval) * plan.interval


def explorer_due(plan: Plan, step: int, last_sync_step: int) -> bool:
    """dynamic_by_explorer: has the explorer run `interval` steps since it last synced?"""
    return (step - 1) - last_sync_step >= plan.interval


def async_check_due(plan: Plan, step: int, last_sync_step: int) -> bool:
    """fully_async: does the explorer look for a newer version before `step`? (every
    explorer_sync_interval steps since the step count at its last sync)"""
    return (step - 1) - last_sync_step >= plan.explorer_every


def async_due_next(plan: Plan, completed: int, last_sync_step: int) -> bool:
    """fully_async under nccl: will an explorer that has completed `completed` steps check at its
    next boundary (the one before step completed + 2, after the step it may be running now)?
    Such explorers form the group of a version published now."""
    return async_check_due(plan, completed + 2, last_sync_step)


def load_during_step(plan: Plan, step: int, last_sync_step: int) -> bool:
    """fully_async under checkpoint: may the explorer load a version published while its step `step`
    generates? Yes while the check before `step` is due and nothing was loaded since: a load before
    or during `step` sets last_sync_step to step - 1, which closes the check, so there is at most
    one load per check. Not under nccl: a version's weight group is formed when it is published and
    joined at a step boundary; an explorer outside it cannot receive the broadcast."""
    return (
        plan.style == "fully_async"
        and plan.method == "checkpoint"
        and async_check_due(plan, step, last_sync_step)
    )


def trained_at(step: int, trainer_done: int) -> int:
    """The trainer step that will train explorer step `step` (see the module docstring)."""
    return max(step, trainer_done + 1)


def staleness_floor(plan: Plan, step: int, trainer_done: int) -> int:
    """Oldest version explorer step `step` may run with under max_staleness (0: no bound)."""
    if plan.max_staleness is None:
        return 0
    return max(0, trained_at(step, trainer_done) - plan.max_staleness)


def trainer_publishes(plan: Plan, step: int, last_published: int, requested: bool) -> tuple[bool, str]:
    """Must the trainer publish after finishing `step`? Returns (publish, reason).

    `requested` is true when some live explorer asked for a newer version (dynamic_by_explorer,
    a staleness hold, or a restarted explorer catching up under nccl).
    """
    if step <= last_published:
        return False, f"version {last_published} already published"
    if plan.style == "fixed" and step % plan.interval == 0:
        return True, f"step {step} % sync_interval {plan.interval} == 0"
    if plan.style == "dynamic_by_trainer" and step - last_published >= plan.interval:
        return True, f"{step - last_published} steps since version {last_published}"
    if plan.style == "fully_async" and step - last_published >= plan.trainer_every:
        return True, f"{step - last_published} steps since version {last_published} (trainer_sync_interval)"
    if requested:
        return True, "an explorer asked for a newer version"
    return False, "not a sync step"


def predicted_publish(plan: Plan, step: int, last_published: int, requested: bool) -> bool:
    """BeginTrainerStep's early answer: will the trainer publish after `step`?"""
    return trainer_publishes(plan, step, last_published, requested)[0]
