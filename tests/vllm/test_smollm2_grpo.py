"""`make demo-llm`'s config, two GRPO steps, on the real SmolLM2-135M-Instruct with vLLM rollouts: the
run goes through every service, its reward and version accounting add up (not its accuracy: two
steps teach nothing measurable). To keep it short in CI: 4 questions per step instead of 8 (x 8
samples) and 16 held-out questions instead of 200."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from services.tasks.chat_arith import split_rows
from tests.conftest import REPO, TRINITY

STEPS, HELDOUT, QUESTIONS = 2, 16, 4


@pytest.mark.timeout(900)
def test_two_grpo_steps_of_the_demo_llm_config(smollm2: pathlib.Path, tmp_path: pathlib.Path) -> None:
    data = tmp_path / "smollm2_data"
    data.mkdir()
    train, heldout = split_rows()
    for name, rows in (("train", train), ("heldout", heldout[:HELDOUT])):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {
        **os.environ,
        "SMOLLM2_STEPS": str(STEPS),
        "SMOLLM2_DIR": str(smollm2),
        "TRINITY_ENGINE": "vllm",
        "TRINITY_CHECKPOINT_ROOT_DIR": str(tmp_path),
    }
    sets = [f"services.{svc}.port=0" for svc in ("buffer", "synchronizer", "trainer", "explorer")]
    sets.append(f"buffer.batch_size={QUESTIONS}")
    args = [str(TRINITY), "run", "-c", str(REPO / "examples" / "smollm2_grpo" / "config.yaml")]
    done = subprocess.run(
        [*args, *(a for item in sets for a in ("--set", item))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    run_dir = tmp_path / "trinity-grpc-examples" / "smollm2-arith-grpo-seed0"
    steps = [json.loads(line) for line in (run_dir / "trainer" / "progress.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for record in steps:
        m = record["metrics"]
        assert m["batch/rows"] == QUESTIONS * 8 and len(record["rows"]) == QUESTIONS * 8  # x 8 samples
        assert m["staleness/max"] == 0  # on-policy: sampled by the version just before the step
        assert 0.0 <= m["critic/rewards/mean"] <= 1.0
        # vLLM sampled with exactly the weights the trainer published: the PPO ratio starts at 1
        assert abs(m.get("actor/ppo_kl", 0.0)) < 1e-3, (record["step"], m.get("actor/ppo_kl"))
        assert 0 <= m["batch/skipped_rows"] <= QUESTIONS * 8  # rows of zero advantage: no forward/backward
    explorer = [
        json.loads(line)
        for line in (run_dir / "explorer" / "progress-explorer.jsonl").read_text().splitlines()
    ]
    assert [e["step"] for e in explorer] == [1, 2]

    summary = json.loads((run_dir / "summary.json").read_text())
    [stage] = summary["stages"]
    assert stage["status"] == "complete" and stage["steps"] == STEPS
    rows = STEPS * QUESTIONS * 8
    assert stage["experiences"] == {"written": rows, "trained": rows, "buffered": 0, "dropped": {}}
    assert stage["tokens_trained"] == sum(s["metrics"]["batch/tokens"] for s in steps)
    for when in ("start", "end"):
        scores = stage["eval"][when]
        assert scores["eval/heldout/tasks"] == HELDOUT
        assert next(iter(scores)) == "eval/heldout/strict/mean@1"  # greedy: one answer per question
    assert [p["model_version"] for p in stage["eval"]["curve"]] == [0, STEPS]
    assert stage["phases"]["trainer"]["steps"] == STEPS and stage["phases"]["trainer"]["peak_rss_mb"] > 500
