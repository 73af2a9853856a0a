"""`trinity debug`: run the config's workflow on a few tasks and print every experience it made.

The inner loop of writing a workflow, without services (no buffer, trainer or synchronizer):
- tasks: the first `--tasks` rows of the taskset (the training taskset of the first stage that
  explores, or `--stage` / `--taskset`), in file order without the selector, with the taskset's
  effective settings (services/common/config/tasksets.py) as the buffer would hand them out;
  `--workflow` and `--repeat-times` override the taskset's;
- the model: one engine as the explorer builds it (transformers in process, or vLLM when
  configured), or a running OpenAI-compatible server (`--endpoint`, debug_endpoint.py);
- the explorer's workflow runner, with no retries: every experience is printed (debug_format.py:
  messages, token counts, the action-mask view, reward, metrics), and a workflow that raises fails
  the command with its own traceback on stderr.
Exit codes: 0 every task ran; 1 a workflow raised or timed out; 2 bad input (config, names, files).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.common.errors import InvalidArgument, TrinityError

if TYPE_CHECKING:
    from services.common.config import TrinityConfig
    from services.common.config.buffer import StorageConfig
    from services.explorer.runner import UnitResult
    from services.explorer.workflows import Task

DEFAULT_TASKS = 2


@dataclass
class DebugPlan:
    """What one `trinity debug` runs: the stage's config, the taskset's section and the tasks built from it."""

    cfg: TrinityConfig
    stage: str | None
    taskset: StorageConfig
    is_eval: bool
    workflow: str
    reward_fn: str | None  # the taskset's, else the workflow's default_reward_fn, else None
    tasks: list[Task]


def pick_taskset(
    cfg: TrinityConfig, stage: str | None, taskset: str | None
) -> tuple[TrinityConfig, str | None, StorageConfig, bool]:
    """(stage config, stage name, taskset section, is_eval) of `--stage` / `--taskset`.

    Without `--stage`: the first stage that runs an explorer (mode other than train) and holds the
    taskset; without `--taskset`: the stage's training taskset."""
    names: list[str | None] = [s.stage_name for s in cfg.stages] or [None]
    stages = list(zip(names, cfg.stage_configs, strict=True))
    if stage is not None:
        if stage not in names:
            raise InvalidArgument(f"no stage {stage!r}; the config's stages: {names}", field="--stage")
        stages = [(n, s) for n, s in stages if n == stage]
    else:
        stages = [(n, s) for n, s in stages if s.mode != "train"]
    seen: list[str] = []
    for name, stage_cfg in stages:
        inputs = stage_cfg.buffer.explorer_input
        candidates = [(section, False) for _key, section in inputs.training_tasksets()]
        candidates += [(ts, True) for ts in inputs.eval_tasksets]
        for section, is_eval in candidates:
            seen.append(section.name)
            if (taskset is None and not is_eval) or section.name == taskset:
                return stage_cfg, name, section, is_eval
    where = f"stage {stage!r}" if stage else "the stages that explore (mode other than train)"
    if taskset is None:
        raise InvalidArgument(
            f"{where}: no buffer.explorer_input.taskset (or tasksets); name one with --taskset (tasksets: {seen}) "
            "or pick a stage with --stage",
            field="buffer.explorer_input.taskset",
        )
    raise InvalidArgument(
        f"no taskset {taskset!r} in {where}; tasksets: {sorted(set(seen))}", field="--taskset"
    )


def build_tasks(
    cfg: TrinityConfig,
    section: StorageConfig,
    *,
    is_eval: bool,
    count: int,
    workflow: str | None = None,
    repeat_times: int | None = None,
) -> tuple[list[Task], str]:
    """The first `count` rows of the taskset as workflow tasks, settings as the buffer resolves them;
    and the reward fn name the taskset gives ("" for none)."""
    from services.buffer.taskfile import load_rows, task_id_of
    from services.common.config.tasksets import TasksetDefaults, effective_taskset, task_settings
    from services.common.experience import Task as WireTask
    from services.explorer.explorer import TaskResolver

    effective = effective_taskset(section, TasksetDefaults.from_config(cfg), is_eval=is_eval)
    if effective.storage_type != "file" or not effective.path:
        raise InvalidArgument(
            f"taskset {section.name!r} has no file to read (storage_type {effective.storage_type!r}, "
            f"path {effective.path!r}); trinity debug reads tasks from files",
            field="buffer.explorer_input.taskset.path",
        )
    rows = load_rows(effective.path, split=effective.split, subset_name=effective.subset_name)
    settings = task_settings(effective)
    if workflow:
        settings["workflow"] = workflow
    if repeat_times:
        settings["repeat_times"] = repeat_times
    resolve = TaskResolver()
    tasks = [
        resolve(
            WireTask(
                **settings,
                raw_task=row,
                is_eval=is_eval,
                task_id=task_id_of(row, index),
                index=index,
                taskset=section.name,
            ),
            0,
        )
        for index, row in enumerate(rows[:count])
    ]
    return tasks, str(settings["reward_fn"])


def plan(args: argparse.Namespace) -> DebugPlan:
    """Everything before a model loads: config, plugins, the workflow's name and preflight, the tasks."""
    import os

    from services.cli.prepare import prepare_data
    from services.common.config import load_config
    from services.explorer.plugins import load_plugins
    from services.explorer.workflows import WORKFLOWS

    cfg, stage, section, is_eval = pick_taskset(
        load_config(args.config, args.overrides), args.stage, args.taskset
    )
    os.environ.update(cfg.explorer.env_vars)
    load_plugins(cfg.explorer.plugin_dirs)
    if args.workflow:
        WORKFLOWS.get(args.workflow, field="--workflow")  # unknown: the error lists the registered names
    with contextlib.redirect_stdout(sys.stderr):  # stdout is the experiences' (--json)
        prepare_data(cfg)
    tasks, reward_fn = build_tasks(
        cfg,
        section,
        is_eval=is_eval,
        count=args.tasks,
        workflow=args.workflow,
        repeat_times=args.repeat_times,
    )
    if not tasks:
        raise InvalidArgument(
            f"taskset {section.name!r} has no rows", field="buffer.explorer_input.taskset.path"
        )
    first = tasks[0]
    preflight = getattr(first.workflow, "preflight", None)  # missing packages or data, before the model
    problems = preflight(dict(first.workflow_args)) if preflight is not None else []
    if problems:
        raise InvalidArgument(
            "; ".join(problems), field="--workflow" if args.workflow else "default_workflow_type"
        )
    # one engine is enough to look at a few tasks (explorer.rollout_model.engine_num may ask for more)
    rollout = cfg.explorer.rollout_model.model_copy(update={"engine_num": 1})
    cfg = cfg.model_copy(update={"explorer": cfg.explorer.model_copy(update={"rollout_model": rollout})})
    default = getattr(first.workflow, "default_reward_fn", None)
    reward_name = reward_fn or (str(default) if default else None)
    return DebugPlan(cfg, stage, section, is_eval, first.workflow_name, reward_name, tasks)


async def run_plan(p: DebugPlan, args: argparse.Namespace) -> tuple[list[UnitResult], Any]:
    """Build the explorer's parts (engine, runner, auxiliary models), run the tasks once each, close."""
    from services.explorer.server import build_parts

    make_pool = None
    if args.endpoint:
        from services.cli.debug_endpoint import endpoint_pool

        make_pool = endpoint_pool(args.endpoint, api_key=args.api_key, model=args.endpoint_model)
    parts = await asyncio.to_thread(build_parts, p.cfg, make_pool)
    try:
        runner = parts["runner"]
        runner.max_retry_times = 0  # the first failure is the one to show
        return await runner.run_tasks(p.tasks), parts["tokenizer"]
    finally:
        for key in ("runner", "pool"):
            parts[key].close()
        for obj in parts["owned"]:
            obj.close()


def failure_record(result: UnitResult) -> dict[str, Any]:
    exc = result.failure
    return {
        "task_index": result.task.index,
        "task_id": result.task.task_id,
        "run_index": result.run_index,
        "errors": list(result.errors),
        "traceback": "".join(traceback.format_exception(exc)) if exc is not None else None,
    }


def report(p: DebugPlan, args: argparse.Namespace, results: list[UnitResult], tokenizer: Any) -> int:
    """Print the experiences (stdout) and each failure's traceback (stderr); the exit code."""
    from services.cli.debug_format import experience_record, render_summary, render_text

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    records = [
        experience_record(exp, task_index=r.task.index, decode=decode)
        for r in results
        for exp in r.experiences
    ]
    failures = [failure_record(r) for r in results if r.skipped]
    task = p.tasks[0]
    header = {
        "config": args.config or "(embedded default)",
        "stage": p.stage,
        "taskset": p.taskset.name,
        "is_eval": p.is_eval,
        "workflow": p.workflow,
        "reward_fn": p.reward_fn,
        "model": args.endpoint or p.cfg.model.model_path,
        "tasks": len(p.tasks),
        "repeat_times": task.repeat_times,
    }
    if args.json:
        print(json.dumps({**header, "experiences": records, "failures": failures}, ensure_ascii=False))
    else:
        print(
            f"trinity debug: workflow {header['workflow']}"
            + (f" (reward fn {header['reward_fn']})" if header["reward_fn"] else "")
            + f" on "
            f"{header['tasks']} task(s) of taskset {header['taskset']} x {header['repeat_times']} "
            f"repeat(s), model {header['model']}"
        )
        for i, record in enumerate(records, 1):
            print("\n".join(render_text(record, number=i, total=len(records))))
        print(render_summary(records, failures))
    for failure in failures:
        print(
            f"\ntask {failure['task_index']} (id {failure['task_id']}) failed: {'; '.join(failure['errors'])}",
            file=sys.stderr,
        )
        if failure["traceback"]:
            print(failure["traceback"], file=sys.stderr, end="")
    return 1 if failures else 0


def cmd_debug(args: argparse.Namespace) -> int:
    from services.common.logging import configure_logging

    # the command reports every failure itself (with its traceback); the services' logs are for -v
    configure_logging("debug", "INFO" if args.verbose else "CRITICAL", json=False)
    try:
        p = plan(args)
        results, tokenizer = asyncio.run(run_plan(p, args))
    except TrinityError as exc:
        print(f"trinity debug: {exc}", file=sys.stderr)
        return 2
    return report(p, args, results, tokenizer)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_debug_parser(sub: argparse._SubParsersAction) -> None:
    from services.common.entry import add_serve_args

    debug = sub.add_parser(
        "debug", help="run the config's workflow on a few tasks and print each experience (no services)"
    )
    add_serve_args(debug)
    debug.add_argument("--workflow", help="workflow name or dotted path (default: the taskset's)")
    debug.add_argument(
        "--tasks", type=_positive, default=DEFAULT_TASKS, help=f"tasks to run (default {DEFAULT_TASKS})"
    )
    debug.add_argument("--repeat-times", type=_positive, help="rollouts per task (default: the taskset's)")
    debug.add_argument("--stage", help="the stage whose config to use (default: the first that explores)")
    debug.add_argument(
        "--taskset", help="a taskset by name, e.g. an eval taskset (default: the training one)"
    )
    debug.add_argument("--endpoint", help="sample from this OpenAI-compatible server (http://host:port/v1)")
    debug.add_argument("--endpoint-model", help="model id at the endpoint (default: the first it lists)")
    debug.add_argument("--api-key", default="EMPTY", help="bearer token for --endpoint")
    debug.add_argument("--json", action="store_true", help="one JSON document on stdout")
    debug.add_argument(
        "--verbose", "-v", action="store_true", help="show the explorer's logs (INFO); default: none"
    )
    debug.set_defaults(func=cmd_debug)
