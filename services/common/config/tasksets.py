"""A taskset's effective settings: one function, Trinity's precedence, applied at load and by the buffer.

`effective_taskset(section, defaults, is_eval=...)` is the only place that decides which workflow,
reward fn, repeat_times, sampling arguments and epochs a taskset runs with. The loader applies it to
every taskset of the config (so `trinity config check` and the resolved YAML show the values), the
buffer applies it to each taskset it creates (a no-op for the loader's, the fallbacks for one an agent
creates at run time) and puts the result on every Task it hands out; the explorer only looks the
names up. Precedence, as Trinity-RFT's config validator (`_check_explorer_input`):

| setting | training taskset | eval taskset |
| --- | --- | --- |
| workflow | taskset.default_workflow_type > explorer_input.default_workflow_type > buffer.default_workflow_type | taskset.default_workflow_type > explorer_input.default_eval_workflow_type > (then as training) |
| reward fn | taskset.default_reward_fn_type > explorer_input.default_reward_fn_type > buffer.default_reward_fn_type | same |
| repeat_times | algorithm.repeat_times (preset applied); a different taskset.repeat_times is refused at load | taskset.repeat_times > 1 |
| rollout_args | taskset.rollout_args > model.temperature / top_p / top_k / logprobs | same |
| total_epochs / total_steps | taskset's > buffer.total_epochs / total_steps | taskset's > 1 / none |

`buffer.default_workflow_type` / `default_reward_fn_type` are older Trinity spellings kept as the last
fallback. The items of `buffer.explorer_input.tasksets` (several training tasksets) follow the training
column, and an unnamed one is `taskset_<i>` (Trinity's name); their mixing is the buffer's
(services/buffer/kinds/mix.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from services.common.config.buffer import StorageConfig

if TYPE_CHECKING:
    from services.common.config.schema import TrinityConfig


@dataclass(frozen=True)
class TasksetDefaults:
    """What a taskset falls back to, taken from the rest of the config."""

    workflow: str = ""
    eval_workflow: str = ""
    reward_fn: str = ""
    repeat_times: int = 1
    rollout_args: dict[str, Any] = field(default_factory=dict)
    total_epochs: int = 1
    total_steps: int | None = None

    @classmethod
    def from_config(cls, cfg: TrinityConfig) -> TasksetDefaults:
        b, inputs = cfg.buffer, cfg.buffer.explorer_input
        return cls(
            workflow=inputs.default_workflow_type or b.default_workflow_type or "",
            eval_workflow=inputs.default_eval_workflow_type or "",
            reward_fn=inputs.default_reward_fn_type or b.default_reward_fn_type or "",
            repeat_times=cfg.algorithm.repeat_times,
            rollout_args=dict(cfg.model.rollout_defaults),
            total_epochs=b.total_epochs,
            total_steps=b.total_steps,
        )


def effective_taskset(section: StorageConfig, defaults: TasksetDefaults, *, is_eval: bool) -> StorageConfig:
    """`section` with every setting above decided (a copy; `section` is untouched). Idempotent."""
    workflow = (
        section.default_workflow_type
        or (defaults.eval_workflow if is_eval else "")
        or defaults.workflow
        or None
    )
    updates: dict[str, Any] = {
        "default_workflow_type": workflow,
        "default_reward_fn_type": section.default_reward_fn_type or defaults.reward_fn or None,
        "rollout_args": {**defaults.rollout_args, **section.rollout_args},
    }
    if is_eval:
        updates["repeat_times"] = section.repeat_times or 1
        updates["total_epochs"] = section.total_epochs or 1
        updates["total_steps"] = section.total_steps
    else:
        updates["repeat_times"] = section.repeat_times or defaults.repeat_times
        updates["total_epochs"] = section.total_epochs or defaults.total_epochs
        updates["total_steps"] = section.total_steps or defaults.total_steps
    return section.model_copy(update=updates)


def task_settings(section: StorageConfig) -> dict[str, Any]:
    """What every Task of an effective taskset carries on the wire (the buffer's Task fields); the
    reward fn's arguments travel in workflow_args["reward_fn_args"]."""
    workflow_args = dict(section.workflow_args)
    if section.reward_fn_args:
        workflow_args.setdefault("reward_fn_args", dict(section.reward_fn_args))
    return {
        "workflow": section.default_workflow_type or "",
        "reward_fn": section.default_reward_fn_type or "",
        "format_args": section.format.model_dump(),
        "rollout_args": dict(section.rollout_args),
        "workflow_args": workflow_args,
        "repeat_times": section.repeat_times or 1,
    }


def training_conflicts(cfg: TrinityConfig) -> list[tuple[tuple[str | int, ...], str]]:
    """(key location, why) of each training-taskset setting that cannot stand.

    repeat_times: Trinity overwrites a training taskset's with algorithm.repeat_times; here a different
    value is an error instead (the trainer's batch is batch_size x algorithm.repeat_times, so a taskset
    sampling another count would never fill it, or mix groups). temperature: the trainer recomputes
    logprobs at one sampling temperature, so mixed tasksets must sample at the same one."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    inputs = cfg.buffer.explorer_input
    sets: list[tuple[tuple[str | int, ...], StorageConfig]] = []
    sets += [(("taskset",), inputs.taskset)] if inputs.taskset is not None else []
    sets += [(("tasksets", i), ts) for i, ts in enumerate(inputs.tasksets)]
    for loc, ts in sets:
        if ts.repeat_times is not None and ts.repeat_times != cfg.algorithm.repeat_times:
            key = f"buffer.explorer_input.{dotted_loc(loc)}.repeat_times"
            out.append(
                (
                    ("buffer", "explorer_input", *loc, "repeat_times"),
                    f"{key} ({ts.repeat_times}) differs from algorithm.repeat_times "
                    f"({cfg.algorithm.repeat_times}); rollouts per training task are algorithm.repeat_times "
                    "(as in Trinity): set it there and remove the taskset's key",
                )
            )
    defaults = dict(cfg.model.rollout_defaults)
    # unset: 1.0, as the engines and the trainer (services/trainer/settings.py) read it
    temps = [float({**defaults, **ts.rollout_args}.get("temperature") or 1.0) for ts in inputs.tasksets]
    for i, temp in enumerate(temps[1:], start=1):
        if temp != temps[0]:
            out.append(
                (
                    ("buffer", "explorer_input", "tasksets", i, "rollout_args", "temperature"),
                    f"buffer.explorer_input.tasksets[{i}].rollout_args.temperature ({temp}) differs from "
                    f"tasksets[0]'s ({temps[0]}); the trainer recomputes logprobs at one sampling "
                    "temperature: give every mixed taskset the same (or set model.temperature only)",
                )
            )
    return out


def dotted_loc(loc: tuple[str | int, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def resolve_tasksets(cfg: TrinityConfig) -> TrinityConfig:
    """`cfg` with the training and eval tasksets replaced by their effective settings."""
    defaults = TasksetDefaults.from_config(cfg)
    inputs = cfg.buffer.explorer_input
    updates: dict[str, Any] = {
        "eval_tasksets": [effective_taskset(ts, defaults, is_eval=True) for ts in inputs.eval_tasksets],
        "tasksets": [
            effective_taskset(ts, defaults, is_eval=False).model_copy(
                update={"name": ts.name or f"taskset_{i}"}
            )
            for i, ts in enumerate(inputs.tasksets)
        ],
    }
    if inputs.taskset is not None:
        updates["taskset"] = effective_taskset(inputs.taskset, defaults, is_eval=False)
    buffer = cfg.buffer.model_copy(update={"explorer_input": inputs.model_copy(update=updates)})
    resolved = cfg.model_copy(update={"buffer": buffer})
    resolved._stage_configs = cfg._stage_configs
    return resolved
