"""Evaluation: run eval tasksets with the weights held and score them as mean@k / best@k / worst@k.

For every numeric quantity of the rollouts (the reward and each workflow metric such as
`accuracy`), with k samples per task: mean@k is the mean over tasks of the mean over samples,
best@k the mean over tasks of the best sample, worst@k of the worst. Keys are
`eval/<taskset>/<metric>/mean@<k>`; eval experiences are never written to the buffer.

A taskset graded by a boxed-answer reward (its reward fn's name contains `boxed`, e.g.
`boxed_shaped_reward`) also gets answer metrics per sample, from the reply and the task's truth
(`answer_metrics`): `strict` (the last \\boxed{} holds the answer), `lenient` (the boxed answer, else
the last number, is right), `boxed` (a well-formed box is present), `reply_chars` (reply length).
Replies and truths are read and compared by the one answer reader, services/explorer/rewards/answers.py.
Every sample's question, truth, answer and reward are kept too (`answer_records`): the explorer
appends them to <run dir>/eval/answers.jsonl, which `trinity view` compares between checkpoints.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from services.common.logging import get_logger
from services.explorer.rewards.answers import last_boxed, last_number, same_answer, truth_answer
from services.explorer.runner import UnitResult, WorkflowRunner

log = get_logger("explorer.eval")


def answer_metrics(response: str, truth: str) -> dict[str, float]:
    """strict / lenient / boxed / reply_chars of one reply (see the module docstring)."""
    answer = truth_answer(truth)
    boxed = last_boxed(response)
    strict = boxed is not None and same_answer(boxed, answer)
    lenient = strict if boxed is not None else same_answer(last_number(response), answer)
    return {
        "strict": float(strict),
        "lenient": float(lenient),
        "boxed": float(boxed is not None),
        "reply_chars": float(len(response)),
    }


def wants_answer_metrics(taskset: Any, default_reward: str | None = None) -> bool:
    """True for a taskset graded by a boxed-answer reward (by its reward fn's name)."""
    name = getattr(taskset, "default_reward_fn_type", None) or default_reward or ""
    return "boxed" in str(name)


def score_results(
    taskset: str, results: Sequence[UnitResult], *, with_answers: bool = False
) -> dict[str, float]:
    """mean@k / best@k / worst@k per metric over the tasks of one taskset (skipped units count as no sample)."""
    per_task: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for result in results:
        key = result.task.task_id or str(result.task.index)
        per_task[key]  # a task whose every rollout was skipped still counts, with reward 0
        for exp in result.experiences:
            per_task[key]["reward"].append(float(exp.reward or 0.0))
            for name, value in exp.metrics.items():
                if name != "reward":  # a reward fn's parts may repeat the total: one sample, one reward
                    per_task[key][name].append(float(value))
            truth = exp.info.get("truth")
            if with_answers and truth is not None:
                for name, value in answer_metrics(exp.response_text, str(truth)).items():
                    per_task[key][name].append(value)
    if not per_task:
        return {}
    k = max((len(v["reward"]) for v in per_task.values()), default=0) or 1
    names = sorted({name for metrics in per_task.values() for name in metrics} | {"reward"})
    scores: dict[str, float] = {}
    for name in names:
        samples = [metrics.get(name) or [0.0] for metrics in per_task.values()]
        scores[f"eval/{taskset}/{name}/mean@{k}"] = float(np.mean([np.mean(s) for s in samples]))
        if k > 1:
            scores[f"eval/{taskset}/{name}/best@{k}"] = float(np.mean([np.max(s) for s in samples]))
            scores[f"eval/{taskset}/{name}/worst@{k}"] = float(np.mean([np.min(s) for s in samples]))
    scores[f"eval/{taskset}/tasks"] = float(len(per_task))
    return scores


def question_of(exp: Any) -> str:
    """The prompt an eval answer replied to: its text, else the last user message."""
    if exp.prompt_text:
        return str(exp.prompt_text)
    users = [m.content for m in exp.messages if m.role == "user"]
    return users[-1] if users else ""


def answer_records(taskset: str, results: Sequence[UnitResult]) -> list[dict[str, Any]]:
    """One record per eval sample: the held-out question, its truth, the model's answer and reward
    (<run dir>/eval/answers.jsonl; `trinity view` compares them between checkpoints)."""
    return [
        {
            "taskset": taskset,
            "task_id": result.task.task_id or str(result.task.index),
            "run_id": exp.run_id,
            "question": question_of(exp),
            "truth": exp.info.get("truth"),
            "answer": exp.response_text,
            "reward": exp.reward,
        }
        for result in results
        for exp in result.experiences
    ]


class Evaluator:
    """Reads each eval taskset from its first batch to its end and runs it on the runner."""

    def __init__(
        self,
        *,
        buffer: Any,
        runner: WorkflowRunner,
        tasksets: Sequence[Any],
        resolve: Callable[[Any, int], Any],
        reader_id: str,
        batch_size: int,
        default_reward: str | None = None,
        pack: Callable[[list[Any]], list[Any]] | None = None,
    ) -> None:
        self.default_reward = default_reward  # buffer.default_reward_fn_type
        self.pack = pack  # CoD packing of each batch read (cod: section), else None
        self.buffer = buffer
        self.runner = runner
        self.tasksets = list(tasksets)
        self.resolve = resolve
        self.reader_id = reader_id
        self.batch_size = batch_size
        self.last_answers: list[dict[str, Any]] = []  # answer_records of the last evaluate()

    @property
    def names(self) -> list[str]:
        return [ts.name for ts in self.tasksets]

    async def evaluate(self, step: int, names: Sequence[str] | None = None) -> dict[str, float]:
        scores: dict[str, float] = {}
        self.last_answers = []
        for taskset in self.tasksets:
            if names and taskset.name not in names:
                continue
            results = await self._run_taskset(taskset.name, step)
            self.last_answers.extend(answer_records(taskset.name, results))
            with_answers = wants_answer_metrics(taskset, self.default_reward)
            scores.update(score_results(taskset.name, results, with_answers=with_answers))
        if scores:
            log.info("evaluated", step=step, **{k: round(v, 4) for k, v in scores.items()})
        return scores

    async def _run_taskset(self, name: str, step: int) -> list[UnitResult]:
        results: list[UnitResult] = []
        rewind, first_epoch = True, None
        while True:
            batch = await self.buffer.read_tasks(
                name, self.batch_size, reader_id=self.reader_id, rewind=rewind
            )
            rewind = False
            if first_epoch is None:
                first_epoch = batch.epoch
            if not batch.tasks or batch.epoch != first_epoch:
                break
            tasks = [self.resolve(t, step) for t in batch.tasks]
            results.extend(await self.runner.run_tasks(self.pack(tasks) if self.pack else tasks))
            if batch.end_of_data:
                break
        return results


EvalFn = Callable[[int], Awaitable[dict[str, float]]]
