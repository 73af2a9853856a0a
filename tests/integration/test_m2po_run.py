"""`trinity run` of M2PO (Trinity v0.6's algorithm_type m2po) with rollout correction on, through the
real CLI on the builtin tiny model (issue 31, part 2).

Weights sync every 2 steps, so the explorer's two steps both sample from the base model: the
trainer's step 1 trains on-policy data (its ratio to the engine's logprobs is 1 up to float noise),
its step 2 trains data one update stale (the ratio moves off 1). A plugin reward (digits in the
response) varies within each group, so the GRPO advantages and the update are not zero. Checked in
the trainer's progress.jsonl: the rollout-correction metrics (veRL's names) and M2PO's are there and
finite every step; step 1 says on-policy (IS weights of mean 1, nothing rejected, KL ~ 0), step 2
sees the gap.
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.conftest import write_config
from tests.integration.test_e2e_run import PORTS, finish, progress, start_run

STEPS = 2
REWARD = """
def digits(response, **_):
    return sum(c.isdigit() for c in response) / 4.0
"""


@pytest.mark.timeout(600)
def test_m2po_with_rollout_correction_trains_and_reports_on_policy_ratios(tmp_path: pathlib.Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), 16, seed=5), tasks)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "digits.py").write_text(REWARD)
    config = write_config(
        tmp_path / "config.yaml",
        {
            "project": "offpolicy",
            "name": "m2po",
            "mode": "both",
            "checkpoint_root_dir": str(tmp_path / "runs"),
            "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 8, "max_response_tokens": 4},
            "algorithm": {
                "algorithm_type": "m2po",
                "repeat_times": 4,
                "bypass_old_logprobs": True,
                "optimizer": {"lr": 1e-3},
                "policy_loss_fn_args": {"m2_threshold": 0.04, "log_ratio_clip": 20.0},
                "rollout_correction": {
                    "rollout_is": "token",
                    "rollout_is_threshold": 2.0,
                    "rollout_rs": "token_k1",
                    "rollout_rs_threshold": "0.5_2.0",
                },
            },
            "buffer": {
                "batch_size": 4,
                "total_steps": STEPS,
                "explorer_input": {
                    "taskset": {
                        "name": "tasks",
                        "path": str(tasks),
                        "format": {"prompt_key": "question", "response_key": "answer"},
                        "default_workflow_type": "arith_workflow",
                        "default_reward_fn_type": "trinity_plugin_digits:digits",
                        "rollout_args": {"temperature": 1.0},
                    },
                },
                "trainer_input": {"experience_buffer": {"name": "experiences", "storage_type": "queue"}},
            },
            "explorer": {"eval_on_startup": False, "plugin_dirs": [str(plugins)]},
            "synchronizer": {"sync_method": "checkpoint", "sync_interval": 2},
            "monitor": {"monitor_type": "none"},
            "services": {**PORTS, "shutdown_grace_s": 3},
        },
    )
    log = tmp_path / "run.log"
    finish(start_run(config, log), log, timeout=450)

    run_dir = tmp_path / "runs" / "offpolicy" / "m2po"
    (stage,) = json.loads((run_dir / "summary.json").read_text())["stages"]
    assert stage["steps"] == STEPS and stage["experiences"]["trained"] == STEPS * 4 * 4
    records = progress(run_dir)
    assert len(records) == STEPS
    for record in records:
        metrics = record["metrics"]
        corr = {k: v for k, v in metrics.items() if k.startswith("rollout_corr/")}
        assert {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_max", "rollout_corr/kl"} <= set(corr)
        assert all(math.isfinite(v) for v in corr.values()), corr
        assert all(
            math.isfinite(metrics[k]) for k in ("actor/pg_loss", "actor/ratio/mean", "actor/m2po/m2_before")
        )
        assert 0.5 < corr["rollout_corr/rollout_is_mean"] < 2.0, corr
    on_policy, stale = (record["metrics"] for record in records)
    assert on_policy["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3), on_policy
    assert on_policy["rollout_corr/rollout_is_max"] == pytest.approx(1.0, abs=1e-2), on_policy
    assert on_policy["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert abs(on_policy["rollout_corr/kl"]) < 1e-4 and on_policy["actor/m2po/masked_fraction"] == 0.0
    assert on_policy["actor/ratio/mean"] == pytest.approx(1.0, abs=1e-3)
    # one update stale (lr 1e-3): step 1 changed the weights (its advantages were not all 0), so the
    # trainer's policy has moved away from the one that sampled
    assert abs(stale["rollout_corr/kl"]) > 1e-6 and stale["rollout_corr/k3_kl"] > 0, stale
