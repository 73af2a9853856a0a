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

from services.common.config.schema import TrinityConfig
from services.common.experience import Experience
from services.common.wire import jsonable


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
        "tokens": jsonable(exp.tokens),
        "logprobs": jsonable(exp.logprobs),
        "action_mask": jsonable(exp.action_mask),
        "prompt_text": exp.prompt_text,
        "response_text": exp.response_text,
        "info": jsonable(exp.info),
        "metrics": jsonable(exp.metrics),
    }


class PipelineInputLog:
    """Appends each step's pre-pipeline experiences to `path` (parents created on first write)."""

    def __init__(self, path: str) -> None:
        self.path = pathlib.Path(path)

    @classmethod
    def from_config(cls, cfg: TrinityConfig) -> PipelineInputLog | None:
        """The log save_input asks for (default <run dir>/buffer/pipeline_input.jsonl), or None:
        without operators the buffer holds exactly the input."""
        dp = cfg.data_processor.experience_pipeline
        if dp is None or not dp.operators or not dp.save_input:
            return None
        return cls(dp.input_save_path or os.path.join(cfg.run_dir, "buffer", "pipeline_input.jsonl"))

    def append(self, step: int, exps: list[Experience]) -> None:
        text = "".join(json.dumps(experience_record(step, e), ensure_ascii=False) + "\n" for e in exps)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
