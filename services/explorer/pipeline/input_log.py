"""`data_processor.experience_pipeline.save_input`: each explore step's experiences as they were
before the pipeline's operators changed or dropped them, appended to a JSON-lines file.

One line per experience: the step, ids, model version, reward, token ids with the prompt length,
logprobs and action mask, texts, info and metrics. A step's lines are written and fsynced together,
after the rollouts and before the operators run. A restarted explorer redoes its last unwritten
step, so that step's lines can appear twice: `step` and `group_id` tell them apart.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np

from services.common.experience import Experience


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def experience_record(step: int, exp: Experience) -> dict[str, Any]:
    return {
        "step": step,
        "task_id": exp.task_id,
        "run_id": exp.run_id,
        "group_id": exp.group_id,
        "producer": exp.producer,
        "model_version": exp.model_version,
        "reward": exp.reward,
        "prompt_length": exp.prompt_length,
        "response_length": exp.response_length,
        "tokens": _plain(exp.tokens),
        "logprobs": _plain(exp.logprobs),
        "action_mask": _plain(exp.action_mask),
        "prompt_text": exp.prompt_text,
        "response_text": exp.response_text,
        "info": _plain(exp.info),
        "metrics": _plain(exp.metrics),
    }


class PipelineInputLog:
    """Appends each step's pre-pipeline experiences to `path` (parents created on first write)."""

    def __init__(self, path: str) -> None:
        self.path = pathlib.Path(path)

    def append(self, step: int, exps: list[Experience]) -> None:
        text = "".join(json.dumps(experience_record(step, e), ensure_ascii=False) + "\n" for e in exps)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
