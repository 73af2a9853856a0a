"""`trinity run` of on-policy distillation with a real teacher (issue 20).

The student (builtin:tiny-arith) samples through on_policy_distill_workflow; the teacher, a different
local model served as explorer.auxiliary_models[0] (builtin:tiny-30m: same character tokenizer,
other weights), scores every response token; the on_policy_distill algorithm trains on
kl_coef * (teacher - student) per token. Checked: both steps trained, every rollout carried teacher
logprobs (the KL metric is logged and is not zero: the two models differ).
"""

from __future__ import annotations

import json
import pathlib

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import write_config
from tests.integration.test_e2e_run import PORTS, finish, progress, start_run


@pytest.mark.timeout(600)
@pytest.mark.parametrize("algorithm", ["on_policy_distill", "jsd"])
def test_distill_run_completes_with_teacher_logprobs(tmp_path: pathlib.Path, algorithm: str) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"q": f"{i:03d}+{i:03d}=", "a": str(2 * i)}) + "\n" for i in range(8))
    )
    config = write_config(
        tmp_path / "config.yaml",
        {
            "project": "d",
            "name": algorithm,
            "mode": "both",
            "checkpoint_root_dir": str(tmp_path / "runs"),
            "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 48, "max_response_tokens": 8},
            "algorithm": {"algorithm_type": algorithm, "repeat_times": 2},
            "buffer": {
                "batch_size": 2,
                "total_steps": 2,
                "explorer_input": {
                    "taskset": {
                        "name": "t",
                        "storage_type": "file",
                        "path": str(tasks),
                        "format": {"prompt_key": "q", "response_key": "a", "prompt_type": "plaintext"},
                    },
                    "default_workflow_type": "on_policy_distill_workflow",
                },
                "trainer_input": {"experience_buffer": {"name": "experiences", "storage_type": "queue"}},
            },
            "explorer": {"auxiliary_models": [{"model_path": "builtin:tiny-30m"}]},
            "synchronizer": {"sync_method": "checkpoint", "sync_interval": 1},
            "monitor": {"monitor_type": "tensorboard"},
            "services": {**PORTS, "shutdown_grace_s": 3},
        },
    )
    log = tmp_path / "run.log"
    finish(start_run(config, log), log, timeout=450)

    run_dir = tmp_path / "runs" / "d" / algorithm
    (stage,) = json.loads((run_dir / "summary.json").read_text())["stages"]
    assert stage["steps"] == 2 and stage["experiences"]["trained"] == 2 * 2 * 2
    assert len(progress(run_dir)) == 2
    scalars = EventAccumulator(str(run_dir / "monitor" / "tensorboard" / "explorer"))
    scalars.Reload()
    kl = [e.value for e in scalars.Scalars("rollout/kl_divergence/mean")]
    assert len(kl) == 2 and all(abs(k) > 1e-3 for k in kl)
    trainer = EventAccumulator(str(run_dir / "monitor" / "tensorboard" / "trainer"))
    trainer.Reload()
    signal = "kl/mean" if algorithm == "on_policy_distill" else "jsd/mean"
    assert any(signal in tag for tag in trainer.Tags()["scalars"]), trainer.Tags()["scalars"]
