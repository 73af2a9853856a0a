"""`trinity run` of GRPO with model.lora_configs on builtin:tiny-arith: the four real services, the
trainer training a peft adapter and pushing the merged weights through a weight group (nccl = gloo
on CPU) every step.

What would break if the merge or the names were wrong: the explorer could not load the pushed
weights (unknown names), or it would sample from other weights than the trainer's policy, and
the importance ratio of the next step's rows would move away from 1 (the lr is large on purpose,
so the adapter moves the policy visibly within a step).
"""

from __future__ import annotations

import json
import pathlib

import pytest
from safetensors.torch import load_file

from services.models.loading import build_builtin
from tests.conftest import write_config
from tests.integration.test_e2e_run import PORTS, finish, progress, start_run


@pytest.mark.timeout(600)
def test_lora_grpo_run_trains_the_adapter_and_serves_merged_weights(tmp_path: pathlib.Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"q": f"{i}+{i}=", "a": str(2 * i)}) + "\n" for i in range(12)))
    # The untrained model never answers right: a reward by the share of "1"s in the reply differs
    # within a group from the first step, so GRPO has a signal and the adapter moves.
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "ones.py").write_text(
        "from services.explorer.rewards import REWARD_FUNCTIONS\n"
        "def ones(response, truth=None, **_):\n"
        "    return {'ones': response.count('1') / max(1, len(response))}\n"
        "REWARD_FUNCTIONS.register_module('ones_reward', ones, force=True)\n"
    )
    config = write_config(
        tmp_path / "config.yaml",
        {
            "project": "lora",
            "name": "grpo",
            "mode": "both",
            "checkpoint_root_dir": str(tmp_path / "runs"),
            "model": {
                "model_path": "builtin:tiny-arith",
                "max_prompt_tokens": 48,
                "max_response_tokens": 8,
                "lora_configs": [{"lora_rank": 4, "lora_alpha": 8}],
            },
            "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "optimizer": {"lr": 2e-2}},
            "buffer": {
                "batch_size": 4,
                "total_steps": 3,
                "explorer_input": {
                    "taskset": {
                        "name": "t",
                        "storage_type": "file",
                        "path": str(tasks),
                        "format": {"prompt_key": "q", "response_key": "a"},
                        "rollout_args": {"temperature": 1.0},
                    },
                    "default_workflow_type": "math_workflow",
                    "default_reward_fn_type": "ones_reward",
                },
                "trainer_input": {"experience_buffer": {"name": "experiences", "storage_type": "queue"}},
            },
            "trainer": {"save_interval": 3},
            "explorer": {"plugin_dirs": [str(plugins)]},
            "synchronizer": {"sync_method": "nccl", "sync_interval": 1},
            "monitor": {"monitor_type": "none"},
            "services": {**PORTS, "shutdown_grace_s": 3},
        },
    )
    log = tmp_path / "run.log"
    finish(start_run(config, log), log, timeout=400)

    run_dir = tmp_path / "runs" / "lora" / "grpo"
    (stage,) = json.loads((run_dir / "summary.json").read_text())["stages"]
    assert stage["steps"] == 3 and stage["experiences"]["trained"] == 3 * 4 * 4
    rows = progress(run_dir)
    assert len(rows) == 3
    for row in rows:  # the explorer sampled from the trainer's policy (base + adapter, merged)
        assert abs(row["metrics"]["actor/ppo_kl"]) < 1e-4, row["metrics"]
    checkpoint = run_dir / "checkpoints" / "full" / "global_step_3"
    adapter = json.loads((checkpoint / "lora_adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8
    merged = load_file(str(next((checkpoint / "model").glob("*.safetensors"))))
    base = build_builtin("builtin:tiny-arith").state_dict()
    assert set(base) >= set(merged) and len(merged) > 0  # the base model's names, no lora_A / lora_B
    attention = "transformer.h.0.attn.c_attn.weight"
    assert not (merged[attention] == base[attention]).all()  # trained: the merged weights moved
    embedding = "transformer.wte.weight"  # not adapted ("all-linear"), frozen: the base's own
    assert (merged[embedding] == base[embedding]).all()
