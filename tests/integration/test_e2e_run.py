"""`trinity run` end to end through the real CLI: four service processes, real SQLite, real torch.

1. The embedded demo, shortened (SFT 250 steps, GRPO 60): the stages chain, the eval runs before
   and after each stage, the reward of the training batches rises under GRPO, and every experience
   the explorer wrote was trained on or is still buffered.
2. Faults: the trainer and the explorer are SIGKILLed mid-run (the runner restarts them), then the
   runner itself is SIGKILLed (its children stop on their own) and the same command is run again:
   the run finishes, the step count continues (never back, up to total_steps), the rows of the
   steps the trainer's crash lost are trained again from its replay journal, no row's update is in
   the weights twice, and summary.json's counters add up exactly (written = trained + buffered +
   dropped).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import time

import pytest
import yaml

from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.conftest import REPO
from tests.integration.drills import (
    child_pids,
    events,
    finish,
    in_weights,
    kill_all,
    kill_trainer_past_a_checkpoint,
    progress,
    start_run,
    wait_for,
)

pytestmark = pytest.mark.slow
DEFAULT = REPO / "services" / "common" / "config" / "default.yaml"
PORTS = {svc: {"port": 0} for svc in ("buffer", "synchronizer", "trainer", "explorer")}


@pytest.mark.timeout(900)
def test_demo_shortened_through_the_cli(tmp_path: pathlib.Path) -> None:
    cfg = yaml.safe_load(DEFAULT.read_text())
    cfg["checkpoint_root_dir"] = str(tmp_path / "runs")
    cfg["services"] = {**PORTS, "shutdown_grace_s": 3}
    cfg["stages"][0]["buffer"]["total_steps"] = 250
    cfg["buffer"]["total_steps"] = 60
    cfg["explorer"]["eval_interval"] = 1000
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    log = tmp_path / "run.log"

    out = finish(start_run(config, log), log, timeout=600)

    run_dir = tmp_path / "runs" / "trinity-grpc" / "demo"
    summary = json.loads((run_dir / "summary.json").read_text())
    sft, grpo = summary["stages"]
    assert [sft["name"], grpo["name"]] == ["sft", "grpo"]
    key = "eval/eval/accuracy/mean@1"
    assert next(iter(sft["eval"]["start"])) == key  # main score first
    assert sft["eval"]["start"][key] == 0.0  # the untrained model cannot add
    assert sft["eval"]["end"][key] == grpo["eval"]["start"][key]  # grpo starts from sft's weights
    assert sft["steps"] == 250 and sft["experiences"]["trained"] == 250 * 128
    assert grpo["steps"] == 60
    exp = grpo["experiences"]
    assert exp["written"] == 60 * 32 * 8
    assert exp["written"] == exp["trained"] + exp["buffered"] and exp["dropped"] == {}, exp  # none lost
    # where each service's time went, in summary.json and in the end table
    assert set(sft["phases"]) == {"trainer"} and sft["phases"]["trainer"]["steps"] == 250
    assert set(grpo["phases"]) == {"trainer", "explorer:explorer"}
    for service, phases in grpo["phases"].items():
        assert phases["steps"] == 60, service
        assert sum(phases["share"].values()) == pytest.approx(1.0, abs=0.01), service
        assert f"grpo {service} (60 steps, " in out
    assert grpo["phases"]["trainer"]["phases"]["forward_backward"] > 0
    assert grpo["phases"]["explorer:explorer"]["phases"]["rollout"] > 0
    assert exp["buffered"] == 0  # the trainer consumed all of it
    # the reward of the training batches (the explorer's rollouts) rises under GRPO
    rewards = [row["metrics"]["critic/rewards/mean"] for row in progress(run_dir / "grpo")]
    assert len(rewards) == 60
    first, last = sum(rewards[:15]) / 15, sum(rewards[-15:]) / 15
    assert last > first + 0.05, (first, last, rewards)
    # the display and the artefacts a user is told about
    assert "eval start: " + key in out and "eval end: " + key in out
    sft_end, grpo_end = sft["eval"]["end"][key], grpo["eval"]["end"][key]
    assert f"{key}: start 0.000 -> sft {sft_end:.3f} -> grpo {grpo_end:.3f}" in out  # base, SFT, GRPO
    assert "stage           steps" in out and f"summary: {run_dir / 'summary.json'}" in out
    assert f"TensorBoard: tensorboard --logdir {run_dir}" in out
    every_service = ["buffer", "synchronizer", "trainer", "explorer"]
    for stage, services in (("sft", ["buffer", "synchronizer", "trainer"]), ("grpo", every_service)):
        for service in services:
            assert list((run_dir / stage / "monitor" / "tensorboard" / service).glob("events.out.tfevents.*"))
    assert (tmp_path / "runs" / "trinity-grpc" / "demo_data" / "rl.jsonl").exists()


@pytest.mark.timeout(900)
def test_killed_services_and_runner_continue_the_run(tmp_path: pathlib.Path) -> None:
    data = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), 1000, seed=5), data)
    taskset = {
        "name": "tasks",
        "storage_type": "file",
        "path": str(data),
        "format": {"prompt_key": "question", "response_key": "answer"},
        "rollout_args": {"temperature": 1.0, "max_tokens": 4},
        "default_workflow_type": "arith_workflow",
    }
    cfg = {
        "project": "faults",
        "name": "run",
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 8, "max_response_tokens": 4},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "buffer": {
            "batch_size": 8,
            "total_steps": 40,
            "explorer_input": {"taskset": taskset},
            "trainer_input": {"experience_buffer": {"name": "experiences", "storage_type": "queue"}},
        },
        "explorer": {"eval_on_startup": False},
        "synchronizer": {"sync_method": "checkpoint", "sync_interval": 1},
        "trainer": {"save_interval": 5, "micro_batch_size": 32},
        "services": {**PORTS, "shutdown_grace_s": 3},
    }
    config = tmp_path / "faults.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    run_dir = tmp_path / "runs" / "faults" / "run"
    log = tmp_path / "run.log"
    marker = str(run_dir)
    steps = lambda: [row["step"] for row in progress(run_dir)]  # noqa: E731

    procs: list[subprocess.Popen] = []
    try:
        proc = start_run(config, log)
        procs.append(proc)
        # killed past a checkpoint (save_interval 5), never on one, so its last steps are not in the
        # checkpoint it resumes from
        kill_trainer_past_a_checkpoint(run_dir, 5, 8, proc, 240)
        wait_for(
            "the trainer's restart",
            lambda: "trainer exited with code -9; restarting it" in log.read_text(),
            proc,
            30,
        )
        wait_for("8 more steps", lambda: len(steps()) >= 16, proc, 240)
        [explorer] = child_pids(marker, "explorer")
        os.kill(explorer, signal.SIGKILL)
        wait_for(
            "the explorer's restart",
            lambda: "explorer exited with code -9; restarting it" in log.read_text(),
            proc,
            30,
        )
        wait_for("4 more steps", lambda: len(steps()) >= 20, proc, 240)
        os.kill(proc.pid, signal.SIGKILL)  # the runner itself: its children notice and stop
        proc.wait(10)
        deadline = time.monotonic() + 60
        while any(child_pids(marker, s) for s in ("buffer", "synchronizer", "trainer", "explorer")):
            assert time.monotonic() < deadline, "services outlived their killed runner"
            time.sleep(0.5)
        before = steps()
        assert before[-1] < 40

        procs.append(start_run(config, log))  # the same command again
        out = finish(procs[-1], log, timeout=400)

    finally:  # a failed assertion must not leave services running
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        kill_all(marker)
    rows = progress(run_dir)
    sequence = [row["step"] for row in rows]
    # the count continues across every restart: never back, never from 1 again, up to total_steps
    assert sequence[0] == 1 and sequence[-1] == 40, sequence
    assert all(b > a for a, b in zip(sequence, sequence[1:], strict=False)), sequence
    assert len(sequence) >= 38, sequence  # a kill between publish and log may hide one step's line
    live, lost = in_weights(rows, events(run_dir))
    assert lost, "the trainer was killed a step or two after its checkpoint: steps were lost"
    trained = [rid for row in live for rid in row["rows"]]
    assert len(trained) == len(set(trained)), "a row's update is in the weights twice"
    # every row of a lost step was trained again from the trainer's replay journal
    replayed = [rid for row in rows if row.get("replayed") for rid in row["rows"]]
    assert {rid for row in lost for rid in row["rows"]} <= set(replayed)
    summary = json.loads((run_dir / "summary.json").read_text())
    [stage] = summary["stages"]
    assert stage["status"] == "complete" and stage["steps"] == 40
    counts = stage["experiences"]
    assert counts["trained"] == len(trained) > 0 and stage["updates_lost"] == 0
    assert counts["written"] == counts["trained"] + counts["buffered"] + sum(counts["dropped"].values())
    assert "stage 1/1" in out and "summary: " in out
