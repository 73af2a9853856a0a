"""`make demo-agent`'s driver end to end on the builtin tiny model: `trinity run` in mode serve, a
mode-train trainer beside it on the ports the run chose, the Node.js agent, then summary.json and
the plot (two steps: it checks the wiring, not the learning)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from tests.conftest import REPO


def test_the_demo_agent_driver_runs_serve_train_and_the_agent_to_a_summary(tmp_path: pathlib.Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
        "SMOLLM2_DIR": "builtin:tiny-arith",
        "TRINITY_CHECKPOINT_ROOT_DIR": str(tmp_path),
        "AGENT_STEPS": "2",
        "AGENT_HELDOUT": "4",
        "AGENT_EVAL_EVERY": "1",
        "AGENT_MAX_TOKENS": "12",
        "AGENT_PROXY_PORT": "0",
    }
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "serve_agent" / "demo.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "trinity-grpc-examples" / "smollm2-agent-seed0"
    [stage] = json.loads((run_dir / "summary.json").read_text())["stages"]
    curve = stage["eval"]["curve"]
    assert [p["step"] for p in curve] == [0, 1, 2, 2]  # start, after each step, and on the final weights
    assert curve[-1]["model_version"] == 2 and "eval/heldout/strict/mean@1" in curve[-1]["scores"]
    assert (run_dir / "plot.png").exists()
    trainer = [json.loads(x) for x in (run_dir / "trainer" / "progress.jsonl").read_text().splitlines()]
    assert len(trainer) == 2 and all(r["metrics"]["batch/rows"] == 32 for r in trainer)
