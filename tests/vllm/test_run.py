"""`trinity run` with `engine_type: vllm` on CPU: GRPO on a tiny Llama, a sync every step by a gloo
group (by checkpoint files: test_smollm2_grpo.py, on the real model; in mode colocate, copied from
the trainer's shared weights). Every step trains on
experiences sampled by the version the plan names (staleness 0 on-policy), and the explorer's
logprobs are the trainer's own: the PPO ratio starts at 1 (ppo_kl ~ 0), which holds only if vLLM
served exactly the weights the trainer published."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
import yaml

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.conftest import TRINITY
from tests.vllm.conftest import build_tiny_llama

PORTS = {svc: {"port": 0} for svc in ("buffer", "synchronizer", "trainer", "explorer")}
STEPS = 4


def vllm_config(tmp_path: pathlib.Path, name: str) -> dict:
    model_dir = tmp_path / "model"
    build_tiny_llama(model_dir)
    data = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), 64, seed=5), data)
    return {
        "project": "vllm",
        "name": name,
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {
            "model_path": str(model_dir),
            "max_prompt_tokens": 8,
            "max_response_tokens": 4,
            "dtype": "float32",
        },
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "optimizer": {"lr": 1.0e-3}},
        "buffer": {
            "batch_size": 4,
            "total_steps": STEPS,
            "explorer_input": {
                "taskset": {
                    "name": "tasks",
                    "path": str(data),
                    "format": {"prompt_key": "question", "response_key": "answer"},
                    "default_workflow_type": "arith_workflow",
                    "rollout_args": {"temperature": 1.0, "top_k": 20, "top_p": 0.95, "max_tokens": 4},
                }
            },
            "trainer_input": {"experience_buffer": {"name": "experiences", "storage_type": "queue"}},
        },
        "explorer": {"eval_on_startup": False, "rollout_model": {"engine_type": "vllm", "dtype": "float32"}},
        "synchronizer": {"sync_interval": 1, "sync_offset": 0},
        "trainer": {"save_interval": 100},
        "monitor": {"monitor_type": "none"},
        "services": {**PORTS, "shutdown_grace_s": 5, "health_wait_s": 180},
    }


def run(tmp_path: pathlib.Path, cfg: dict) -> pathlib.Path:
    """`trinity run` of `cfg`; returns the run directory after checking every step trained on-policy
    from exactly the weights the trainer published (staleness 0, ppo_kl ~ 0)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    done = subprocess.run(
        [str(TRINITY), "run", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    run_dir = tmp_path / "runs" / "vllm" / cfg["name"]
    steps = [json.loads(line) for line in (run_dir / "trainer" / "progress.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    for record in steps:
        metrics = record["metrics"]
        # trained on rows of version step - 1 exactly: what the plan (interval 1, offset 0) names
        assert metrics["staleness/max"] == 0 and metrics["staleness/mean"] == 0, record["step"]
        kl = next(v for k, v in metrics.items() if k.endswith("ppo_kl"))
        assert abs(kl) < 1e-3, (record["step"], kl)
    summary = json.loads((run_dir / "summary.json").read_text())
    stage = summary["stages"][-1]
    assert stage["status"] == "complete" and stage["experiences"]["trained"] == STEPS * 4 * 4
    return run_dir


@pytest.mark.timeout(900)
def test_grpo_on_vllm_follows_the_sync_plan(tmp_path: pathlib.Path) -> None:
    cfg = vllm_config(tmp_path, "nccl")
    cfg["synchronizer"]["sync_method"] = "nccl"
    run(tmp_path, cfg)


@pytest.mark.timeout(900)
def test_colocate_copies_each_version_from_the_trainers_shared_weights(tmp_path: pathlib.Path) -> None:
    """mode colocate with vLLM: no checkpoint and no broadcast; each version is copied from the
    trainer's shared files (weights_copied, one per published version) and sampled on-policy. An
    entropy bonus and a large learning rate move the weights at every step (the untrained model's
    groups are flat), so ppo_kl ~ 0 says the engine served each new version."""
    cfg = vllm_config(tmp_path, "colocate")
    cfg["mode"] = "colocate"
    cfg["synchronizer"]["sync_method"] = "memory"
    cfg["algorithm"].update(entropy_loss_fn="default", entropy_loss_fn_args={"entropy_coef": 0.5})
    cfg["algorithm"]["optimizer"]["lr"] = 3e-2
    run_dir = run(tmp_path, cfg)
    trained = [json.loads(line) for line in (run_dir / "trainer" / "progress.jsonl").read_text().splitlines()]
    assert all(record["metrics"]["actor/grad_norm"] > 0.01 for record in trained)
    explorer_log = (run_dir / "logs" / "explorer.log").read_text().splitlines()
    copied = [json.loads(line) for line in explorer_log if '"weights_copied"' in line]
    assert [event["version"] for event in copied] == list(range(1, STEPS))  # step s samples version s - 1
    assert not any('"checkpoint_loaded"' in line for line in explorer_log)
