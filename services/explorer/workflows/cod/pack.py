"""CoD packs: a step's tasks packed by taskset (pack_tasks), and one pack run (CodPackWorkflow).

Packing (Trinity's pack_tasks), per taskset in reading order, with n = cod.task_pack_size
(eval_task_pack_size for evaluation tasks):
- cod: consecutive tasks form packs of n; ralph_sample: the first task of each would-be pack,
  repeated n times; for both, a taskset with fewer than n tasks in the batch is dropped for the step,
  and the tail that does not fill a pack is dropped, or completed by repeating the taskset's first
  tasks with pad_tasks_to_full_pack;
- ralph_full: every task repeated n times (one pack per task; nothing dropped or padded).

A pack run with iterative_hint_e2e (the only method): hint "Hints: null"; solve task 0 with it; update
the hints from task 0's trajectory, reward and feedback (hints.py; with update_context_impl
pde_update_context, without the reward); solve task 1 with the new hints;
... solve task n-1. Rows get info exp_type (solve_task / gen_hint), task_idx / hint_idx, taskset_id
(the taskset's name), the run's task_rewards [r_0..r_{n-1}] and total_reward sum_i r_i decay^(n-1-i)
(task_reward_decay) for the cod advantage; the last row of each solve gets the metric
reward_iterative_hint_e2e_taskset_<taskset>_pos_<i>.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from services.common.config.cod import CodConfig, CodWorkflowArgs
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import Task, Workflow
from services.explorer.workflows.cod.hints import INITIAL_HINT, update_hints

METHOD = "iterative_hint_e2e"
UPDATE_IMPLS = ("update_context", "pde_update_context")  # hints.py; update_context_agent is not here


def update_impl_of(workflow_args: dict[str, Any], cod_args: Any) -> str:
    """A taskset's update_context_impl: its workflow_args' own, else cod.cod_workflow_args'."""
    return str(workflow_args.get("update_context_impl", cod_args.update_context_impl))


def pack_tasks(tasks: Sequence[Task], cod: CodConfig, *, is_eval: bool = False) -> list[Task]:
    """The packs of `tasks` (module docstring); each is a Task running CodPackWorkflow."""
    size, strategy = cod.pack_size(is_eval), cod.packing_strategy
    args = cod.cod_workflow_args
    by_taskset: dict[str, list[Task]] = {}
    for task in tasks:
        by_taskset.setdefault(task.taskset, []).append(task)
    packs: list[Task] = []
    for members in by_taskset.values():
        if strategy == "ralph_full":
            groups = [[_with_env_index(t, i % size) for _ in range(size)] for i, t in enumerate(members)]
        else:
            if len(members) < size:
                continue
            if args.pad_tasks_to_full_pack and len(members) % size:
                members = members + members[: size - len(members) % size]
            chunks = [members[i : i + size] for i in range(0, len(members) - size + 1, size)]
            if strategy == "ralph_sample":
                chunks = [[_with_env_index(chunk[0], 0) for _ in range(size)] for chunk in chunks]
            groups = chunks
        for group in groups:
            packs.append(_pack(group, args, len(packs)))
    return packs


def _with_env_index(task: Task, index: int) -> Task:
    return task.copy_with(raw_task={**task.raw_task, "_env_task_idx": index})


def _pack(group: list[Task], args: CodWorkflowArgs, number: int) -> Task:
    first = group[0]
    return first.copy_with(
        workflow=CodPackWorkflow,
        workflow_name="cod_pack",
        workflow_args=args.model_dump(),
        raw_task={"cod_tasks": group},
        task_id=f"pack{number}-{first.task_id}",
    )


def pack_seed(pack: Task, members: Sequence[Task], stable: bool) -> int:
    """A seed shared by a pack's tasks: from its rows' (taskset, index) pairs, sorted (stable: the same
    rows, the same seed, in any order, as Trinity's), or from the step and the pack's id."""
    key = sorted([t.taskset, t.index] for t in members) if stable else [pack.batch_id, pack.task_id]
    return int.from_bytes(hashlib.sha256(json.dumps(key, separators=(",", ":")).encode()).digest()[:8], "big")


class CodPackWorkflow(Workflow):
    """One rollout of a CoD pack (module docstring). Built by pack_tasks, not named in configs."""

    is_async = True

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.given_auxiliary = auxiliary_models
        self.args = CodWorkflowArgs.model_validate(task.workflow_args)
        self.members: list[Task] = list(task.raw_task["cod_tasks"])
        self.episodes: dict[int, Any] = {}  # position -> workflow instance, with reuse_workflow_instance
        mode = self.args.context_compression_mode
        if mode is not None:  # the tasksets' own setting wins
            self.members = [
                t
                if "context_compression_mode" in t.workflow_args
                else t.copy_with(workflow_args={**t.workflow_args, "context_compression_mode": mode})
                for t in self.members
            ]
        if self.args.inject_pack_seed:
            seed = pack_seed(task, self.members, self.args.stable_pack_seed)
            self.members = [
                t.copy_with(
                    raw_task={
                        **t.raw_task,
                        "pack_seed": seed,
                        "task_idx": t.raw_task.get("_env_task_idx", i),
                        "pack_size": len(self.members),
                    }
                )
                for i, t in enumerate(self.members)
            ]

    def _episode(self, task: Task, position: int) -> Any:
        if not hasattr(task.workflow, "set_hint"):
            name = task.workflow_name or getattr(task.workflow, "__name__", "?")
            raise InvalidArgument(
                f"taskset {task.taskset!r}: workflow {name!r} is not a CoD "
                "workflow (it takes no hints); with a cod: section every taskset needs a cod_* workflow",
                field="default_workflow_type",
            )
        cached: Any = self.episodes.get(position)
        same_kind = cached is not None and type(cached) is task.workflow
        if self.args.reuse_workflow_instance and same_kind and cached.resettable():
            cached.reset(task)
            return cached
        episode = task.to_workflow(self.model, self.given_auxiliary)
        if self.args.reuse_workflow_instance:
            self.episodes[position] = episode
        return episode

    async def run_async(self) -> list[Experience]:
        if self.args.activated_cod_methods != [METHOD]:
            raise InvalidArgument(
                f"activated_cod_methods {self.args.activated_cod_methods}: only [{METHOD!r}] runs",
                field="cod.cod_workflow_args.activated_cod_methods",
            )
        hint, rewards, exps = INITIAL_HINT, [], []
        shared: dict[str, Any] = {}  # this run's pack state (episode.py)
        for i, task in enumerate(self.members):
            impl = update_impl_of(task.workflow_args, self.args)
            if impl not in UPDATE_IMPLS:
                raise InvalidArgument(
                    f"update_context_impl {impl!r} is not implemented here (only {', '.join(UPDATE_IMPLS)}: one "
                    "chat call)",
                    field="cod.cod_workflow_args.update_context_impl",
                )
            episode = self._episode(task, i)
            episode.set_hint(hint)
            episode.set_pack_state(shared)
            episode.set_max_response_tokens_restraint(self.args.max_response_tokens_restraint)
            solved = await episode.run_async()
            for exp in solved:
                exp.info.update(
                    {"exp_type": "solve_task", "task_idx": i, "taskset_id": task.taskset, "hint": hint}
                )
                exp.info.setdefault("task_desc", task.task_desc)
            reward = float(solved[-1].reward or 0.0) if solved else 0.0
            rewards.append(reward)
            if solved:
                solved[-1].metrics[f"reward_{METHOD}_taskset_{task.taskset}_pos_{i}"] = reward
            exps.extend(solved)
            if i == len(self.members) - 1:
                break
            last = solved[-1].info if solved else {}
            if "trajectory" not in last:
                raise InvalidArgument(
                    f"workflow {task.workflow_name!r} left no info['trajectory'] on its last experience; a CoD "
                    "workflow must (services/explorer/workflows/cod/episode.py does)",
                    field="default_workflow_type",
                )
            update = await update_hints(
                self.model,
                self.args,
                dict(self.task.rollout_args),
                previous=hint,
                trajectory=str(last["trajectory"]),
                reward=reward,
                feedback=str(last.get("feedback", f"Reward: {reward} (max: 1.0)")),
                impl=impl,
            )
            update.step = i
            update.info.update({"exp_type": "gen_hint", "hint_idx": i, "taskset_id": task.taskset})
            exps.append(update)
            hint = update.info["hint"]
        n, decay = len(rewards), self.args.task_reward_decay
        total = sum(r * decay ** (n - 1 - i) for i, r in enumerate(rewards))
        flagged = any(e.info.get("judge_format_error", False) for e in exps)
        for exp in exps:
            exp.info.update({"total_reward": total, "task_rewards": list(rewards)})
            if flagged:
                exp.info["judge_format_error_in_trajectory"] = True
        self._log(exps)
        return exps

    def _log(self, exps: list[Experience]) -> None:
        """Every cod_log_interval explorer steps (from step 1), the run's episodes as one JSON file."""
        step = int(self.task.batch_id)
        if (step - 1) % self.args.cod_log_interval:
            return
        kind = "eval" if self.task.is_eval else "rollout"
        folder = os.path.join(self.args.log_dir, self.args.exp_name, f"{kind}_step_{step}")
        os.makedirs(folder, exist_ok=True)
        rows = [
            {
                "exp_type": e.info.get("exp_type"),
                "index": e.info.get("task_idx", e.info.get("hint_idx")),
                "step": e.step,
                "reward": e.reward,
                "hint": e.info.get("hint"),
                "user_prompt": e.info.get("user_prompt"),
                "response_text": e.response_text,
            }
            for e in exps
        ]
        name = f"{self.task.task_id}_{time.time_ns()}.json".replace(os.sep, "_")
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            json.dump(
                {"task_rewards": exps[0].info.get("task_rewards") if exps else [], "steps": rows}, f, indent=1
            )
