"""The Node.js agent of `make demo-agent` (the `openai` npm package) against a real proxy on the
builtin tiny model: two-turn episodes, its own rewards, commits that reach the buffer as GRPO groups."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

from services.tasks.chat_arith import write_tasksets
from tests.conftest import REPO
from tests.integration.serve_proxy import make_stack, serve_config

AGENT = REPO / "examples" / "serve_agent" / "agent.js"
REWARDS = {0.0, 0.1, 0.5, 1.0}
# the agent samples training episodes at 0.7: the trainer takes logprobs at that temperature
MODEL = {
    "model_path": "builtin:tiny-arith",
    "max_prompt_tokens": 200,
    "max_response_tokens": 8,
    "temperature": 0.7,
}


def test_the_node_agent_trains_through_the_proxy(tmp_path: pathlib.Path) -> None:
    data = tmp_path / "data"
    write_tasksets(data)
    stack = make_stack(
        tmp_path,
        serve_config(
            tmp_path,
            model=MODEL,
        ),
    )
    try:
        stack.start_infra()
        url = stack.start_proxy()
        out = tmp_path / "eval.jsonl"
        args = ["--url", url, "--data", str(data), "--steps", "2", "--batch", "2", "--group", "2"]
        args += ["--heldout", "3", "--eval-every", "2", "--max-tokens", "8", "--out", str(out)]
        env = {**os.environ, "NODE_PATH": str(REPO / "tools" / "node" / "node_modules")}
        done = subprocess.run(
            ["node", str(AGENT), *args], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        steps = [x for x in lines if x["event"] == "agent_step"]
        assert [s["step"] for s in steps] == [1, 2] and all(s["episodes"] == 4 for s in steps)
        evals = [json.loads(line) for line in out.read_text().splitlines()]
        assert [e["step"] for e in evals] == [0, 2] and all(e["model_version"] == 0 for e in evals)
        # each episode is one experience of two turns, unless the tiny model's reply broke the echo:
        # then its session splits into two one-turn experiences (info["splits"]), same group and reward
        rows = stack.read(8)
        stats = stack.stats()["counters"]
        assert stats["sessions_committed"] == 8
        rows += stack.read(stats["experiences_written"] - 8, wait=5.0)
        assert len(rows) == stats["experiences_written"] and {r.reward for r in rows} <= REWARDS
        assert len({r.group_id for r in rows}) == 4  # 2 steps x 2 questions, 2 episodes each
        two_turns = [r for r in rows if int(r.info["turns"]) == 2]
        split = [r for r in rows if int(r.info["turns"]) != 2]
        assert len(two_turns) >= 6 and len(two_turns) + len(split) / 2 == 8
        assert all(int(r.info["turns"]) == 1 and int(r.info["splits"]) >= 1 for r in split)
        for row in two_turns:  # reply 1 sampled, the follow-up not, reply 2 sampled
            mask = row.action_mask.tolist()
            assert mask[0] and mask[-1] and not all(mask)
    finally:
        stack.stop_all()


def test_the_agent_paces_itself_to_the_served_version(tmp_path: pathlib.Path) -> None:
    """--max-lag 0: step 2 starts only once the proxy serves the weights trained on step 1's episodes."""
    data = tmp_path / "data"
    write_tasksets(data)
    cfg = serve_config(
        tmp_path,
        model=MODEL,
        algorithm={"algorithm_type": "grpo", "repeat_times": 2, "optimizer": {"lr": 1e-3}},
        buffer={"batch_size": 1},  # one question of two episodes: one GRPO group a step
        trainer={"total_steps": 2, "save_interval": 100, "read_timeout_s": 2},
    )
    stack = make_stack(tmp_path, cfg)
    try:
        stack.start_infra()
        url = stack.start_proxy()
        trainer = stack.start("trainer", "mode=train")
        args = ["--url", url, "--data", str(data), "--steps", "2", "--batch", "1", "--group", "2"]
        args += ["--heldout", "1", "--eval-every", "5", "--max-tokens", "8", "--max-lag", "0"]
        env = {**os.environ, "NODE_PATH": str(REPO / "tools" / "node" / "node_modules")}
        done = subprocess.run(
            ["node", str(AGENT), *args], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        steps = [json.loads(x) for x in done.stdout.splitlines() if '"agent_step"' in x]
        assert [s["step"] for s in steps] == [1, 2]
        assert steps[0]["model_version"] == 0 and steps[0]["waited_s"] == 0
        # it waited for version 1, and sampled step 2 with it (model_version: the newest a reply named)
        assert steps[1]["model_version"] >= 1 and steps[1]["waited_s"] > 0
        assert trainer.wait(180) == 0  # it trained both steps: the agent's two groups
    finally:
        stack.stop_all()
