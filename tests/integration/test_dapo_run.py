"""`trinity run` of algorithm_type dapo on the builtin tiny model, with Trinity's DAPO pipeline
(mask_response_truncated, dapo_dynamic_sampling) and a plugin reward that leaves most groups flat:
the explorer refills each step, so the trainer still trains the configured steps on full batches
of informative groups, and summary.json counts the dropped groups by reason, with
written = trained + buffered + dropped.

The reward: 3 tasks in 4 (by answer) score -1 whatever the reply (flat: `all_wrong`); the rest score
+1 or -1 by the parity of the reply's characters, so their groups of 4 usually mix.
"""

from __future__ import annotations

import json
import pathlib
import textwrap
from typing import Any

import pytest

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.integration.runs import PORTS, stages, trinity_run, write_run_config

pytestmark = pytest.mark.slow
BATCH, REPEAT, STEPS = 2, 4, 3

PLUGIN = textwrap.dedent("""
    import os
    import pathlib
    import signal

    HERE = pathlib.Path(__file__).parent


    def kill_on_call(path):
        # the explorer kills itself at the n-th reward written in `path` (once: the file goes)
        calls = HERE / "calls"
        n = int(calls.read_text()) + 1 if calls.exists() else 1
        calls.write_text(str(n))
        if n == int(path.read_text()):
            path.unlink()
            os.kill(os.getpid(), signal.SIGKILL)


    def mostly_flat(response, truth, **_):
        if (HERE / "kill_at").exists():
            kill_on_call(HERE / "kill_at")
        if int(truth) % 4:
            return -1.0
        return 1.0 if sum(map(ord, response)) % 2 else -1.0
""")


def _config(tmp_path: pathlib.Path, data: pathlib.Path, plugins: pathlib.Path, **sync: Any) -> dict[str, Any]:
    return {
        "project": "dapo",
        "name": "run",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 8, "max_response_tokens": 4},
        "algorithm": {
            "algorithm_type": "dapo",
            "repeat_times": REPEAT,
            "optimizer": {"lr": 1e-4},
            "policy_loss_fn_args": {
                "clip_range_low": 0.2,
                "clip_range_high": 0.28,
                "loss_agg_mode": "token-mean",
            },
        },
        "data_processor": {
            "experience_pipeline": {
                "operators": [{"name": "mask_response_truncated"}, {"name": "dapo_dynamic_sampling"}]
            }
        },
        "buffer": {
            "batch_size": BATCH,
            "total_steps": STEPS,
            "explorer_input": {
                "taskset": {
                    "name": "tasks",
                    "path": str(data),
                    "format": {"prompt_key": "question", "response_key": "answer"},
                    "default_workflow_type": "arith_workflow",
                    "default_reward_fn_type": "trinity_plugin_flat:mostly_flat",
                    "rollout_args": {"temperature": 1.0},
                }
            },
            "trainer_input": {"experience_buffer": {"name": "rollouts", "storage_type": "queue"}},
        },
        "explorer": {"eval_on_startup": False, "plugin_dirs": [str(plugins)], "max_num_gen_batches": 40},
        "synchronizer": sync,
        "monitor": {"monitor_type": "none"},
        "services": {**PORTS, "shutdown_grace_s": 3},
    }


def dapo_run(
    tmp_path: pathlib.Path, *overrides: str, kill_at: int = 0, **sync: Any
) -> tuple[dict[str, Any], pathlib.Path, str]:
    """summary.json's stage entry, the run dir and `trinity run`'s output."""
    data = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), 48, seed=5), data)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "flat.py").write_text(PLUGIN)
    if kill_at:
        (plugins / "kill_at").write_text(str(kill_at))
    config = write_run_config(_config(tmp_path, data, plugins, **sync), tmp_path / "config.yaml")
    output = trinity_run(config, *overrides, timeout=420)
    run_dir = tmp_path / "runs" / "dapo" / "run"
    return stages(run_dir)[0], run_dir, output


def explore_steps(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    lines = (run_dir / "logs" / "explorer.log").read_text().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return [e for e in events if e.get("event") == "explore_step"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "sync",
    [
        pytest.param({}, id="on-policy"),  # sync_interval 1: each explorer step waits for the last update
        pytest.param({"sync_interval": 2, "sync_offset": 1}, id="interval-2-offset-1"),
    ],
)
def test_dapo_trains_full_batches_of_informative_groups(tmp_path: pathlib.Path, sync: dict[str, Any]) -> None:
    summary, run_dir, _ = dapo_run(tmp_path, **sync)
    steps = [json.loads(line) for line in (run_dir / "trainer" / "progress.jsonl").read_text().splitlines()]
    assert summary["status"] == "complete" and summary["steps"] == STEPS
    assert any(e.get("gen_batches", 1) > 1 for e in explore_steps(run_dir))  # steps were refilled
    assert [len(s["rows"]) for s in steps] == [BATCH * REPEAT] * STEPS  # full batches, every step
    counts = summary["experiences"]
    dropped = counts["dropped"]
    assert dropped.get("dapo_dynamic_sampling/all_wrong", 0) >= REPEAT  # the flat groups, by reason
    assert set(dropped) <= {
        "dapo_dynamic_sampling/all_wrong",
        "dapo_dynamic_sampling/all_correct",
        "refill_surplus",
    }
    assert all(n % REPEAT == 0 for n in dropped.values())  # whole groups
    assert counts["written"] == counts["trained"] + counts["buffered"] + sum(dropped.values())
    assert counts["trained"] == STEPS * BATCH * REPEAT and counts["buffered"] == 0


@pytest.mark.timeout(600)
def test_an_explorer_killed_mid_refill_redoes_its_step_on_the_same_tasks(tmp_path: pathlib.Path) -> None:
    """The explorer SIGKILLs itself at the 20th reward, in a refill round of step 1 (rounds of 2
    tasks x 4 rollouts: calls 17-24 are its third); `trinity run` restarts it, it repeats step 1's
    batch and extensions, and every step still writes one batch of groups, nothing twice."""
    summary, run_dir, out = dapo_run(tmp_path, "mode=explore", "buffer.total_steps=2", kill_at=20)
    assert "explorer exited with code -9; restarting it (1/" in out
    steps = explore_steps(run_dir)
    assert [e["step"] for e in steps] == [1, 2] and steps[0]["gen_batches"] >= 3
    counts = summary["experiences"]
    assert counts["buffered"] == 2 * BATCH * REPEAT and counts["trained"] == 0  # full steps, no duplicates
    assert counts["written"] == counts["buffered"] + sum(counts["dropped"].values())


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "sync",
    [
        pytest.param({}, id="on-policy"),  # the cap is passed: every step full
        # the explorer never waits: steps stop short at the cap, the trainer's batches straddle them
        pytest.param({"sync_style": "fully_async", "sync_method": "checkpoint"}, id="fully-async"),
    ],
)
def test_capped_steps_never_stall_and_a_short_last_batch_is_trained(
    tmp_path: pathlib.Path, sync: dict[str, Any]
) -> None:
    # one generation batch a step and mostly flat groups: where the explorer waits for versions, a
    # short step used to stall the trainer (it waited for rows sampled only after its update) until
    # its leases ran out; now the step samples past the cap. Fully async, steps stay short, the
    # trainer's batches straddle them, and its last is short: told by the buffer that no more rows
    # can come (it used to wait forever on rows it held itself), it trains that one and the run ends
    more = () if not sync else ("buffer.total_steps=8",)  # 16 tasks: a few informative groups
    summary, run_dir, _ = dapo_run(tmp_path, "explorer.max_num_gen_batches=1", *more, **sync)
    steps = [json.loads(line) for line in (run_dir / "trainer" / "progress.jsonl").read_text().splitlines()]
    rows = [len(s["rows"]) for s in steps]
    assert all(len(set(s["rows"])) == len(s["rows"]) for s in steps)  # no row twice in a batch
    counts = summary["experiences"]
    dropped = sum(counts["dropped"].values())
    assert counts["written"] == counts["trained"] + counts["buffered"] + dropped
    assert counts["trained"] == sum(rows) and counts["buffered"] == 0
    assert rows[:-1] == [BATCH * REPEAT] * (len(rows) - 1) and 0 < rows[-1] <= BATCH * REPEAT
    assert summary["status"] == "complete", summary
    passed = any('"refill_cap_passed"' in line for line in (run_dir / "logs" / "explorer.log").open())
    assert passed == (not sync)
