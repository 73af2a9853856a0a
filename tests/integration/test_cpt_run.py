"""`trinity run` of algorithm_type cpt (continued pre-training) in mode train, as a user runs it: the
builtin tiny model reads a jsonl file of plain text rows (column `content`, format.text_key), trains
two real steps on every token of them, and writes its checkpoint. Four rows and a batch of four: both
steps see the same rows, so the second step's loss must be lower than the first's."""

from __future__ import annotations

import json
import pathlib

import pytest

from services.tasks.arith import write_jsonl
from tests.integration.runs import PORTS, stages, trinity_run, write_run_config

pytestmark = pytest.mark.slow
DOCS = ["12+34=46. 46-34=12.", "7+8=15. 15-8=7.", "90+9=99. 99-9=90.", "5+5=10. 10-5=5."]


@pytest.mark.timeout(300)
def test_cpt_trains_two_steps_on_every_token_of_text_rows(tmp_path: pathlib.Path) -> None:
    data = tmp_path / "docs.jsonl"
    write_jsonl([{"content": doc, "source": "arith notes"} for doc in DOCS], data)
    cfg = {
        "project": "cpt",
        "name": "run",
        "mode": "train",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "max_model_len": 64},
        "algorithm": {"algorithm_type": "cpt", "optimizer": {"lr": 1e-3}},
        "buffer": {
            "train_batch_size": 4,
            "total_steps": 2,
            "trainer_input": {
                "experience_buffer": {
                    "name": "docs",
                    "storage_type": "file",
                    "path": str(data),
                    "format": {"text_key": "content"},
                }
            },
        },
        "monitor": {"monitor_type": "none"},
        "services": {**PORTS, "shutdown_grace_s": 3},
    }
    trinity_run(write_run_config(cfg, tmp_path / "config.yaml"), timeout=240)

    run_dir = tmp_path / "runs" / "cpt" / "run"
    (stage,) = stages(run_dir)
    assert stage["status"] == "complete" and stage["steps"] == 2 and stage["experiences"]["trained"] == 8
    assert set(stage["phases"]) == {"trainer"}  # mode train: nothing explores
    lines = (run_dir / "trainer" / "progress.jsonl").read_text().splitlines()
    metrics = [json.loads(line)["metrics"] for line in lines]
    assert len(metrics) == 2
    # each row is BOS + its characters + EOS; every token after BOS is trained on
    tokens = sum(len(doc) + 2 for doc in DOCS)
    for step in metrics:
        assert step["batch/tokens"] == tokens and step["batch/action_tokens"] == tokens - len(DOCS)
        assert step["actor/loss"] == step["actor/sft_loss"]
    first, second = (step["actor/sft_loss"] for step in metrics)
    assert second < first, (first, second)
    checkpoint = run_dir / "checkpoints" / "full" / "global_step_2"
    assert (checkpoint / "trainer_state.json").exists() and any((checkpoint / "model").iterdir())
