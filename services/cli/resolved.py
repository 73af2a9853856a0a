"""What `trinity config check` shows besides problems: the values the loader decided for keys the
file left unset (algorithm preset, train_batch_size, each taskset's workflow, reward fn, repeat_times,
sampling and epochs, and config/resolve.py's: the token budget, enable_thinking, the weight bucket), so a user sees what the run will do without reading the code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.common.config.loader import load_raw, merge_stage
from services.common.config.presets import preset
from services.common.config.schema import TrinityConfig

TASKSET_KEYS = (
    "default_workflow_type",
    "default_reward_fn_type",
    "repeat_times",
    "total_epochs",
    "total_steps",
)


def resolved_unset(raw: dict[str, Any], cfg: TrinityConfig) -> list[tuple[str, Any]]:
    """(dotted key, value) for every resolved key that `raw` (the file, overrides applied) leaves unset."""
    out: list[tuple[str, Any]] = []
    algorithm = _mapping(raw.get("algorithm"))
    if algorithm.get("algorithm_type") is None:
        out.append(("algorithm.algorithm_type", cfg.algorithm.algorithm_type))
    for key in preset(cfg.algorithm.algorithm_type):
        if algorithm.get(key) is None:
            out.append((f"algorithm.{key}", getattr(cfg.algorithm, key)))
    trainer = _mapping(raw.get("trainer"))
    if cfg.trainer.use_dynamic_bsz and trainer.get("max_token_len_per_gpu") is None:
        out.append(("trainer.max_token_len_per_gpu", cfg.trainer.max_token_len_per_gpu))
    rollout = _mapping(_mapping(raw.get("explorer")).get("rollout_model"))
    if rollout.get("enable_thinking") is None and cfg.explorer.rollout_model.enable_thinking is not None:
        out.append(("explorer.rollout_model.enable_thinking", cfg.explorer.rollout_model.enable_thinking))
    if (
        rollout.get("weight_sync_buffer_size") is not None
        and _mapping(raw.get("synchronizer")).get("bucket_mb") is None
    ):
        out.append(("synchronizer.bucket_mb", cfg.synchronizer.bucket_mb))
    buffer = _mapping(raw.get("buffer"))
    if buffer.get("train_batch_size") is None:
        out.append(("buffer.train_batch_size", cfg.train_batch_size))
    inputs_raw = _mapping(buffer.get("explorer_input"))
    inputs = cfg.buffer.explorer_input
    if inputs.taskset is not None:
        out += _taskset("buffer.explorer_input.taskset", _mapping(inputs_raw.get("taskset")), inputs.taskset)
    sets_raw = inputs_raw.get("tasksets") or []
    for i, section in enumerate(inputs.tasksets):
        given = _mapping(sets_raw[i]) if i < len(sets_raw) else {}
        if given.get("name") is None:
            out.append((f"buffer.explorer_input.tasksets[{i}].name", section.name))
        out += _taskset(f"buffer.explorer_input.tasksets[{i}]", given, section)
    evals_raw = inputs_raw.get("eval_tasksets") or []
    for i, section in enumerate(inputs.eval_tasksets):
        given = _mapping(evals_raw[i]) if i < len(evals_raw) else {}
        out += _taskset(f"buffer.explorer_input.eval_tasksets[{i}]", given, section)
    return out


def _taskset(path: str, given: dict[str, Any], section: Any) -> list[tuple[str, Any]]:
    out = [
        (f"{path}.{key}", getattr(section, key))
        for key in TASKSET_KEYS
        if given.get(key) is None and getattr(section, key) is not None
    ]
    given_args = _mapping(given.get("rollout_args"))
    out += [(f"{path}.rollout_args.{k}", v) for k, v in section.rollout_args.items() if k not in given_args]
    return out


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def resolved_report(path: str, overrides: Sequence[str], cfg: TrinityConfig) -> list[str]:
    """The lines `trinity config check` prints: per stage when there are stages."""
    raw = load_raw(path, overrides)
    if not cfg.stages:
        parts = [("", raw, cfg)]
    else:
        parts = [
            (f" of stage {stage.stage_name}", merge_stage(raw, stage.model_dump(exclude_none=True)), resolved)
            for stage, resolved in zip(cfg.stages, cfg.stage_configs, strict=True)
        ]
    lines: list[str] = []
    for where, given, resolved in parts:
        items = resolved_unset(given, resolved)
        if items:
            lines.append(f"resolved at load{where} (not set in the file):")
            lines += [f"  {key}: {value}" for key, value in items]
    return lines
