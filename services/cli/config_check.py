"""`trinity config check FILE`: everything `trinity run` would reject, found before anything starts.

Beyond parsing (services/common/config), per stage: the algorithm and its parts build with their
arguments (the same `preflight` as run), the workflow / reward fn / experience-operator names resolve
in the live registries (plugin directories loaded first, so user parts and newly added built-ins
count), the files a stage reads exist (a warning for the demo's data, which run generates), the
services' ports do not collide, and the sync plan is one the synchronizer accepts. Every problem is
reported with the key it comes from, all of them in one run (a key refused while loading hides
none of the later checks); the exit status is 2 when there is any.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from services.common.config import TrinityConfig, load_raw
from services.common.config.buffer import StorageConfig
from services.common.errors import ConfigError, TrinityError

EXPLORING_MODES = ("both", "explore", "bench", "colocate")


@dataclass
class Report:
    """Problems (run would refuse) and warnings (run may still work), each `key: message`."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def problem(self, key: str, message: str) -> None:
        # errors of the parts already start with their key (without a stage's prefix: it is put back)
        unstaged = re.sub(r"^stages\[\d+\]\.", "", key)
        if key and message.startswith(unstaged):
            message = key + message[len(unstaged) :]
        self.problems.append(f"{key}: {message}" if key and not message.startswith(key) else message)

    def warn(self, key: str, message: str) -> None:
        self.warnings.append(f"{key}: {message}")


def check_file(path: str, overrides: list[str]) -> tuple[TrinityConfig | None, Report]:
    """Load `path` and run every check, reporting every problem at once: the Trinity keys refused, the
    schema's errors, the loader's conflicts (services/common/config/diagnose.py) and, on the config
    left when the offending keys are taken out, the checks below. The config is returned only when
    there is no problem (None otherwise, or when the file does not load at all)."""
    from services.common.config.diagnose import diagnose

    report = Report()
    try:
        raw = load_raw(path, overrides)
    except ConfigError as exc:
        report.problem("", str(exc))
        return None, report
    cfg, problems = diagnose(raw)
    for problem in problems:
        for line in problem.message.splitlines():
            report.problem("", line)
    if cfg is None:
        return None, report
    check_config(cfg, report)
    return (None if problems else cfg), report


def check_config(cfg: TrinityConfig, report: Report) -> None:
    _check_plugins(cfg, report)
    _check_ports(cfg, report)
    _check_cluster(cfg, report)
    _check_monitor(cfg, report)
    _check_preflight(cfg, report)
    for index, stage in enumerate(cfg.stage_configs):
        prefix = f"stages[{index}]." if cfg.stages else ""
        _check_sync_plan(stage, prefix, report)
        _check_files(cfg, stage, prefix, report)
        _check_priority_fns(stage, prefix, report)
        if stage.mode in EXPLORING_MODES:
            _check_explorer_parts(stage, prefix, report)
            _check_engine_args(stage, prefix, report)
            _check_cod(stage, prefix, report)


def _check_plugins(cfg: TrinityConfig, report: Report) -> None:
    from services.explorer.plugins import load_plugins

    try:
        load_plugins(cfg.explorer.plugin_dirs)
    except TrinityError as exc:
        report.problem(exc.field or "explorer.plugin_dirs", str(exc))


def _check_preflight(cfg: TrinityConfig, report: Report) -> None:
    from services.cli.prepare import preflight_problems

    for exc in preflight_problems(cfg):
        report.problem(exc.field or "algorithm", str(exc))


def _check_ports(cfg: TrinityConfig, report: Report) -> None:
    used: dict[int, str] = {}
    for name in ("buffer", "synchronizer", "trainer", "explorer"):
        endpoint = cfg.services.endpoint(name)
        if endpoint.port == 0:
            continue
        if endpoint.port in used:
            report.problem(
                f"services.{name}.port",
                f"port {endpoint.port} is also services.{used[endpoint.port]}.port; give each service its own "
                "(or 0 to let trinity run pick free ones)",
            )
        used.setdefault(endpoint.port, f"{name}")
    master = cfg.synchronizer.master_port
    if master and master in used:
        report.problem(
            "synchronizer.master_port",
            f"port {master} is also services.{used[master]}.port; pick another or 0",
        )


def _check_monitor(cfg: TrinityConfig, report: Report) -> None:
    from services.common.monitor_extras import missing_package

    hint = missing_package(cfg.monitor.monitor_type)
    if hint:
        report.problem("monitor.monitor_type", hint)


def _check_cluster(cfg: TrinityConfig, report: Report) -> None:
    import torch

    visible = torch.cuda.device_count()
    wanted = cfg.cluster.gpu_per_node
    if wanted > visible:
        report.warn(
            "cluster.gpu_per_node",
            f"{wanted} GPUs asked for, {visible} visible here: trinity run places the trainer and the "
            "explorer on the GPUs it finds (CPU when none)",
        )


def _check_sync_plan(stage: TrinityConfig, prefix: str, report: Report) -> None:
    from services.synchronizer.plan import Plan

    try:
        Plan.from_config(stage.synchronizer)
    except ValueError as exc:
        report.problem(f"{prefix}synchronizer", str(exc))


def _storages(stage: TrinityConfig) -> Iterator[tuple[str, str | None, str]]:
    """(key, path, storage_type) of every buffer section the stage's mode reads."""
    inputs = stage.buffer.explorer_input
    for key, section in inputs.training_tasksets() if stage.mode in ("both", "explore", "colocate") else []:
        yield key, section.path, section.storage_type
    for i, eval_set in enumerate(inputs.eval_tasksets if stage.mode in EXPLORING_MODES else []):
        yield f"buffer.explorer_input.eval_tasksets[{i}]", eval_set.path, eval_set.storage_type
    if stage.mode not in ("both", "train", "colocate"):
        return
    trainer_input = stage.buffer.trainer_input
    exp = trainer_input.experience_buffer
    yield "buffer.trainer_input.experience_buffer", exp.path, exp.storage_type
    for name, aux in trainer_input.auxiliary_buffers.items():
        yield f"buffer.trainer_input.auxiliary_buffers.{name}", aux.path, aux.storage_type


def _check_files(cfg: TrinityConfig, stage: TrinityConfig, prefix: str, report: Report) -> None:
    demo_dir = os.path.abspath(os.path.join(cfg.checkpoint_root_dir, cfg.project, "demo_data"))
    for key, path, storage_type in _storages(stage):
        if storage_type != "file":
            continue
        if not path:
            report.problem(
                f"{prefix}{key}.path", "a file buffer needs a path (jsonl/parquet file or HF directory)"
            )
        elif os.path.abspath(path).startswith(demo_dir + os.sep) and not os.path.exists(path):
            report.warn(
                f"{prefix}{key}.path", f"{path} does not exist yet: trinity run generates the demo data"
            )
        elif not os.path.exists(path):
            report.problem(f"{prefix}{key}.path", f"{path} does not exist")
    model_path = stage.model.model_path
    if os.path.isabs(model_path) or model_path.startswith("."):
        if not os.path.exists(model_path):
            report.problem(f"{prefix}model.model_path", f"{model_path} does not exist")


def _check_explorer_parts(stage: TrinityConfig, prefix: str, report: Report) -> None:
    from services.explorer.pipeline.operators import ExperiencePipeline
    from services.explorer.rewards import REWARD_FUNCTIONS
    from services.explorer.workflows import WORKFLOWS

    inputs = stage.buffer.explorer_input
    sections: list[tuple[str, StorageConfig | None]] = []
    sections += inputs.training_tasksets() if stage.mode != "bench" else []
    sections += [(f"buffer.explorer_input.eval_tasksets[{i}]", s) for i, s in enumerate(inputs.eval_tasksets)]
    for key, section in sections:
        if section is None:
            continue
        workflow = (
            section.default_workflow_type
            or inputs.default_workflow_type
            or stage.buffer.default_workflow_type
        )
        reward = (
            section.default_reward_fn_type
            or inputs.default_reward_fn_type
            or stage.buffer.default_reward_fn_type
        )
        if workflow is None:
            report.problem(f"{prefix}{key}.default_workflow_type", "no workflow named (e.g. math_workflow)")
        for part_key, registry, name in (
            (f"{key}.default_workflow_type", WORKFLOWS, workflow),
            (f"{key}.default_reward_fn_type", REWARD_FUNCTIONS, reward),
        ):
            if name is None:
                continue
            try:
                part = registry.get(name, field=part_key)
            except TrinityError as exc:
                report.problem(f"{prefix}{part_key}", str(exc))
                continue
            if registry is WORKFLOWS and isinstance(part, type) and hasattr(part, "preflight"):
                for message in part.preflight(dict(section.workflow_args)):
                    report.problem(f"{prefix}{part_key}", message)
            if registry is REWARD_FUNCTIONS and section.reward_fn_args:
                _check_reward_args(part, section.reward_fn_args, f"{prefix}{key}.reward_fn_args", report)
            if registry is REWARD_FUNCTIONS and isinstance(part, type) and hasattr(part, "preflight"):
                for message in part.preflight(
                    dict(section.reward_fn_args)
                ):  # e.g. an LLM judge's package and URL
                    report.problem(f"{prefix}{part_key}", message)
    pipeline = stage.data_processor.experience_pipeline
    if pipeline is not None:
        try:
            ExperiencePipeline.from_config(pipeline.operators)
        except TrinityError as exc:
            report.problem(f"{prefix}{exc.field}", str(exc))


def _check_cod(stage: TrinityConfig, prefix: str, report: Report) -> None:
    """What a CoD run would stop on: a taskset workflow that takes no hints, a hint updater not
    implemented here, the causal cod advantage without packs (services/explorer/workflows/cod)."""
    from services.explorer.workflows import WORKFLOWS

    algorithm = stage.algorithm
    causal = (algorithm.advantage_fn_args or {}).get("iterative_hint_e2e_causal", False)
    if stage.cod is None:
        if algorithm.advantage_fn == "cod" and causal and stage.mode in ("both", "explore", "colocate"):
            report.problem(
                f"{prefix}algorithm.advantage_fn",
                "cod with iterative_hint_e2e_causal scores the episodes of CoD packs; add a cod: section",
            )
        return
    from services.explorer.workflows.cod.pack import UPDATE_IMPLS, update_impl_of

    inputs = stage.buffer.explorer_input
    sections: list[tuple[str, StorageConfig | None]] = []
    sections += inputs.training_tasksets() if stage.mode != "bench" else []
    sections += [(f"buffer.explorer_input.eval_tasksets[{i}]", s) for i, s in enumerate(inputs.eval_tasksets)]
    for key, section in sections:
        if section is None:
            continue
        name = (
            section.default_workflow_type
            or inputs.default_workflow_type
            or stage.buffer.default_workflow_type
        )
        impl = update_impl_of(section.workflow_args, stage.cod.cod_workflow_args)
        if impl not in UPDATE_IMPLS:
            report.problem(
                f"{prefix}{key}.workflow_args.update_context_impl",
                f"{impl!r} is not implemented here; the hints are updated by one chat call "
                f"({' or '.join(UPDATE_IMPLS)})",
            )
        try:
            workflow = WORKFLOWS.get(name) if name else None
        except TrinityError:
            continue  # reported by _check_explorer_parts
        if isinstance(workflow, type) and not hasattr(workflow, "set_hint"):
            report.problem(
                f"{prefix}{key}.default_workflow_type",
                f"{name!r} is not a CoD workflow (it takes no hints); with a cod: section every taskset runs "
                "one, e.g. cod_frozenlake_obscure_workflow",
            )


def _check_priority_fns(stage: TrinityConfig, prefix: str, report: Report) -> None:
    """Each priority queue's fn builds with its arguments (a dotted path imports)."""
    from services.buffer.kinds.priority import make_priority_fn

    trainer_input = stage.buffer.trainer_input
    buffers = [("buffer.trainer_input.experience_buffer", trainer_input.experience_buffer)]
    buffers += [
        (f"buffer.trainer_input.auxiliary_buffers.{k}", v) for k, v in trainer_input.auxiliary_buffers.items()
    ]
    for key, storage in buffers:
        replay = storage.replay
        if storage.storage_type != "queue" or not replay.enable:
            continue
        where = f"{prefix}{key}" + (".replay_buffer" if storage.replay_buffer is not None else "")
        try:
            make_priority_fn(replay.priority_fn, replay.priority_fn_args)
        except TrinityError as exc:
            report.problem(f"{where}.{exc.field}", exc.message)


def _check_engine_args(stage: TrinityConfig, prefix: str, report: Report) -> None:
    """extra_engine_args name vLLM engine arguments (checked against vllm.EngineArgs where vLLM is installed)."""
    import dataclasses
    import importlib.util

    explorer = stage.explorer
    engines = [("explorer.rollout_model", explorer.rollout_model)]
    engines += [
        (f"explorer.auxiliary_models[{i}]", aux.engine_config(explorer.rollout_model))
        for i, aux in enumerate(explorer.auxiliary_models)
    ]
    given = [
        (key, engine)
        for key, engine in engines
        if engine.extra_engine_args and engine.engine_type != "transformers"
    ]
    if not given:
        return
    if importlib.util.find_spec("vllm") is None:
        for key, _engine in given:
            report.warn(
                f"{prefix}{key}.extra_engine_args",
                "vLLM is not installed here, so the names are checked when the engine starts",
            )
        return
    import vllm

    known = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    for key, engine in given:
        for name in sorted(set(engine.extra_engine_args) - known):
            report.problem(
                f"{prefix}{key}.extra_engine_args.{name}",
                f"not an engine argument of the installed vLLM {vllm.__version__} (vllm.EngineArgs)",
            )


def _check_reward_args(reward: object, args: dict[str, object], key: str, report: Report) -> None:
    """reward_fn_args must be arguments the reward takes (its constructor's, for a RewardFn class)."""
    from services.common.registry import check_args

    if not callable(reward):
        return
    try:
        check_args(reward, args, key)
    except TrinityError as exc:
        report.problem(key, str(exc))
    except (TypeError, ValueError):  # no introspectable signature (a C function): run will tell
        return
