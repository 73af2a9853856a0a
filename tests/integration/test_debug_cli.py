"""`trinity debug` as a user runs it: a real subprocess, the builtin tiny model, real workflows.

Checked: the embedded default config prints tasks x repeat_times experiences whose rewards are the
reward fn's on the printed answers; a plugin's reward fn and the text view; a multi-turn workflow's
action-mask view (the environment's text untrained); a workflow that raises fails the command with
its own traceback; an unknown workflow name lists the registered ones (a plugin's among them); and
`--endpoint` samples on a running OpenAI-compatible server (the explorer's own API on the tiny model),
recording exactly the token ids and logprobs the server sampled.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import yaml

from services.explorer.rewards.exact import arith_reward
from services.models.loading import builtin_tokenizer
from tests.conftest import TRINITY

pytestmark = pytest.mark.slow

PLUGIN = """
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.workflows import WORKFLOWS
from services.explorer.workflows.math import ArithWorkflow


@REWARD_FUNCTIONS.register_module("char_count_reward")
def char_count_reward(response, truth=None, prompt=None):
    return {"digits": sum(c.isdigit() for c in response) / 10, "letters": sum(c.isalpha() for c in response) / 100}


def check_answer(text):
    raise ValueError(f"cannot parse {text!r}")


@WORKFLOWS.register_module("raising_workflow")
class RaisingWorkflow(ArithWorkflow):
    def score(self, exp):
        check_answer(exp.response_text)
"""


def char_count_parts(response: str) -> dict[str, float]:
    """What the plugin's reward fn gives `response`, written out again here."""
    return {
        "digits": sum(c.isdigit() for c in response) / 10,
        "letters": sum(c.isalpha() for c in response) / 100,
    }


def debug(
    *args: str, cwd: pathlib.Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TRINITY), "debug", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
    )


def write_config(tmp_path: pathlib.Path, rows: list[dict[str, Any]], **taskset: Any) -> pathlib.Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plugins = tmp_path / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "debug_plugin.py").write_text(PLUGIN)
    data = {
        "mode": "explore",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 200, "max_response_tokens": 5},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 3},
        "buffer": {
            "batch_size": 2,
            "explorer_input": {
                "taskset": {"name": "sums", "storage_type": "file", "path": str(tasks), **taskset}
            },
            "trainer_input": {"experience_buffer": {"name": "exps", "storage_type": "queue"}},
        },
        "explorer": {"plugin_dirs": [str(plugins)]},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


SUMS = [{"question": q, "answer": a} for q, a in (("12+30=", "42"), ("7+1=", "8"), ("5+5=", "10"))]
ARITH = {
    "format": {"prompt_key": "question", "response_key": "answer"},
    "default_workflow_type": "arith_workflow",
}


def check_tokens(exp: dict[str, Any]) -> None:
    """Counts, mask, logprobs and the mask view of one printed experience agree with each other."""
    tok = builtin_tokenizer()
    counts, runs = exp["tokens"], exp["mask_runs"]
    assert counts["prompt"] == len(exp["prompt_ids"]) and counts["response"] == len(exp["response_ids"])
    assert len(exp["action_mask"]) == len(exp["logprobs"]) == counts["response"]
    assert counts["trained"] == sum(exp["action_mask"]) == sum(r["tokens"] for r in runs if r["trained"])
    assert sum(r["tokens"] for r in runs) == counts["response"]
    assert all(a["trained"] != b["trained"] for a, b in zip(runs, runs[1:], strict=False))  # maximal runs
    assert "".join(r["text"] for r in runs) == tok.decode(exp["response_ids"], skip_special_tokens=False)
    assert exp["prompt_decoded"] == tok.decode(exp["prompt_ids"], skip_special_tokens=False)


def test_the_embedded_default_prints_every_rollout_scored_by_its_reward_fn(tmp_path: pathlib.Path) -> None:
    done = debug("--tasks", "2", "--json", cwd=tmp_path, env={"TRINITY_CHECKPOINT_ROOT_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert (out["stage"], out["taskset"], out["workflow"], out["reward_fn"]) == (
        "grpo",
        "rl_tasks",
        "arith_workflow",
        "arith_reward",
    )
    assert (out["tasks"], out["repeat_times"], out["failures"]) == (2, 8, [])
    exps = out["experiences"]
    assert [(e["task_index"], e["run_id"]) for e in exps] == [(t, r) for t in range(2) for r in range(8)]
    rl = tmp_path / "trinity-grpc" / "demo_data" / "rl.jsonl"  # generated for the demo on first use
    rows = [json.loads(line) for line in rl.read_text().splitlines()[:2]]
    for exp in exps:
        row = rows[exp["task_index"]]
        parts = arith_reward(exp["response_text"], truth=row["answer"])
        assert exp["metrics"] == parts and exp["reward"] == sum(parts.values())
        assert exp["prompt_decoded"] == row["question"] and exp["model_version"] == 0
        assert 1 <= exp["tokens"]["response"] <= 5 and exp["tokens"]["trained"] == exp["tokens"]["response"]
        check_tokens(exp)


def blocks(stdout: str) -> Iterator[list[str]]:
    """The text view's experiences, one list of lines each."""
    block: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("=== experience"):
            if block:
                yield block
            block = [line]
        elif block and line:
            block.append(line)
    if block:
        yield block[:-1]  # the summary line follows the last one


def test_a_plugins_reward_fn_and_the_text_view(tmp_path: pathlib.Path) -> None:
    config = write_config(tmp_path, SUMS, **ARITH, default_reward_fn_type="char_count_reward")
    done = debug("--config", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "trinity debug: workflow arith_workflow (reward fn char_count_reward) on 2 task(s) of taskset sums "
        "x 3 repeat(s), model builtin:tiny-arith"
    )
    found = list(blocks(done.stdout))
    assert [b[0].split(":")[0] for b in found] == [f"=== experience {i}/6" for i in range(1, 7)]
    for block in found:
        counts = re.fullmatch(r"response: (\d+) tokens, (\d+) trained \(.*\)", block[2])
        assert counts is not None and counts.group(1) == counts.group(2)
        [run] = [line for line in block if line.startswith("  + ")]  # all trained: one run
        response = json.loads(run[4:])
        for special in ("<pad>", "<bos>", "<eos>", "<unk>"):  # the view keeps them, response_text does not
            response = response.replace(special, "")
        parts = char_count_parts(response)
        reward = float(next(line for line in block if line.startswith("reward: ")).split(": ")[1])
        assert reward == pytest.approx(sum(parts.values()))
    assert lines[-1].startswith("6 experiences, mean reward ")


def test_a_multi_turn_workflow_shows_the_environments_text_untrained(tmp_path: pathlib.Path) -> None:
    games = [{"low": 0, "high": 9, "target": 3}, {"low": 0, "high": 9, "target": 7}]
    config = write_config(
        tmp_path, games, default_workflow_type="multi_turn_workflow", workflow_args={"max_turns": 3}
    )
    done = debug("--config", str(config), "--tasks", "1", "--repeat-times", "2", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    exps = json.loads(done.stdout)["experiences"]
    assert len(exps) == 2
    for exp in exps:
        check_tokens(exp)
        assert exp["prompt_decoded"] == "Guess a number between 0 and 9.\n"
        untrained = [r["text"] for r in exp["mask_runs"] if not r["trained"]]
        assert untrained and all(
            t in ("\nHigher.\n", "\nLower.\n", "\nAnswer with a number.\n") for t in untrained
        )
        assert exp["mask_runs"][0]["trained"] and exp["metrics"]["turns"] == len(untrained) + 1


def test_a_workflow_that_raises_fails_with_its_own_traceback(tmp_path: pathlib.Path) -> None:
    config = write_config(tmp_path, SUMS, **ARITH)
    done = debug("--config", str(config), "--workflow", "raising_workflow", "--tasks", "1", cwd=tmp_path)
    assert done.returncode == 1
    assert "0 experiences, 1 failed (tracebacks on stderr)" in done.stdout
    stderr = done.stderr
    assert "task 0 (id 0) failed: ValueError: cannot parse" in stderr
    assert "Traceback (most recent call last):" in stderr
    plugin, lines = str(tmp_path / "plugins" / "debug_plugin.py"), PLUGIN.splitlines()
    call = lines.index("        check_answer(exp.response_text)") + 1
    raised = lines.index('    raise ValueError(f"cannot parse {text!r}")') + 1
    assert f'File "{plugin}", line {call}, in score' in stderr
    assert f'File "{plugin}", line {raised}, in check_answer' in stderr
    assert stderr.rstrip().splitlines()[-1].startswith("ValueError: cannot parse '")


def test_an_unknown_workflow_lists_the_registered_ones(tmp_path: pathlib.Path) -> None:
    config = write_config(tmp_path, SUMS, **ARITH)
    done = debug("--config", str(config), "--workflow", "arith_workfow", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    message = done.stderr.strip()
    assert message.startswith("trinity debug: --workflow: unknown workflow 'arith_workfow'; allowed: ")
    allowed = message.split("allowed: ")[1].split(", or a dotted path")[0].split(", ")
    assert {"arith_workflow", "math_workflow", "multi_turn_workflow", "raising_workflow"} <= set(allowed)


@pytest.fixture
def tiny_server() -> Iterator[Any]:
    """The explorer's OpenAI API over the tiny model, recording each call (enable_history)."""
    from services.explorer.engines.base import BatchingEngine
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.explorer.model_wrapper import ModelWrapper
    from services.models.loading import load_causal_lm

    tok = builtin_tokenizer()
    model = load_causal_lm("builtin:tiny-arith", seed=7)
    engine = BatchingEngine(
        TransformersEngine(model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    )
    wrapper = ModelWrapper(engine, tok, max_response_tokens=5, enable_history=True, model_name="tiny")
    wrapper.openai_base_url  # noqa: B018 - starts the server
    yield wrapper
    wrapper.close()
    engine.close()


def test_an_endpoint_is_sampled_with_the_ids_and_logprobs_it_returns(
    tmp_path: pathlib.Path, tiny_server
) -> None:
    config = write_config(tmp_path, SUMS, **ARITH)
    done = debug(
        "--config",
        str(config),
        "--endpoint",
        tiny_server.openai_base_url,
        "--repeat-times",
        "2",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["model"] == tiny_server.openai_base_url and len(out["experiences"]) == 2 * 2
    served = {
        (tuple(e.tokens[: e.prompt_length].tolist()), tuple(e.tokens[e.prompt_length :].tolist())): e.logprobs
        for e in tiny_server.extract_experience_from_history()
    }
    assert len(served) == 4
    for exp in out["experiences"]:
        key = (tuple(exp["prompt_ids"]), tuple(exp["response_ids"]))
        assert key in served
        np.testing.assert_allclose(exp["logprobs"], served[key], rtol=1e-6)
        check_tokens(exp)
