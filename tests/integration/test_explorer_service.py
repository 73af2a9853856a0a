"""A real explorer process against real buffer and synchronizer processes, on the builtin tiny model.

One run exercises the whole contract: steps write batch_size x repeat_times experiences whose
logprobs a forward pass of the same weights reproduces; a workflow that raises and one that hangs
are retried, then skipped, and their steps complete; a published version is loaded before the step
the plan names and changes the (greedy) generated text; an explorer killed with SIGKILL and
restarted resumes at the next unread task batch, picks up the version it must hold, and at the end
of the taskset closes its writer so a reader sees end of data.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import textwrap
import time

import numpy as np
import torch

from services.buffer.client import BufferClient
from services.common.config import load_config
from services.common.procs import stop_process, wait_healthy
from services.explorer.engines.transformers_engine import sequence_logprobs
from services.models.loading import load_causal_lm
from services.synchronizer.client import SynchronizerClient
from services.synchronizer.transfer.checkpoint import load_checkpoint
from services.synchronizer.weights import WeightPublisher
from services.tasks.arith import ArithSpec, generate
from trinity_grpc.explorer.v1 import explorer_pb2, explorer_pb2_grpc

PLUGIN = textwrap.dedent('''
    import time

    from services.explorer.workflows import WORKFLOWS
    from services.explorer.workflows.math import SimpleWorkflow


    @WORKFLOWS.register_module("flaky_arith")
    class FlakyArith(SimpleWorkflow):
        """Sync (runs in a thread): raw_task.behavior "raise" always raises, "hang" never returns."""

        default_reward_fn = "arith_reward"

        def run(self):
            behavior = self.task.raw_task.get("behavior")
            if behavior == "raise":
                raise RuntimeError("injected failure")
            if behavior == "hang":
                time.sleep(600)
            return super().run()
''')


def taskset_rows() -> list[dict]:
    rows = generate(ArithSpec(), 10, seed=5)
    first = rows[0]
    return [
        first,
        rows[1],  # step 1
        {**rows[2], "behavior": "raise"},
        rows[3],  # step 2: one task raises every time
        {**rows[4], "behavior": "hang"},
        dict(first),  # step 3: one hangs; `first` again, new weights
        rows[5],
        rows[6],  # step 4
        rows[7],
        rows[8],  # step 5 (read, then the explorer is killed)
        rows[9],
        dict(first),  # step 6, after the restart
    ]


def perturbed(seed: int) -> torch.nn.Module:
    model = load_causal_lm("builtin:tiny-arith")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


async def wait_for(predicate, what: str, timeout: float = 180.0, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"explorer exited ({proc.returncode}) while waiting for {what}:\n"
                + pathlib.Path(proc.log_path).read_text()[-4000:]
            )
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def explorer_info(address: str):
    import grpc

    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await explorer_pb2_grpc.ExplorerServiceStub(channel).GetInfo(
                explorer_pb2.GetInfoRequest(), timeout=2
            )
        except grpc.aio.AioRpcError:
            return None
        return reply.info


async def evaluate(address: str):
    import grpc

    async with grpc.aio.insecure_channel(address) as channel:
        return await explorer_pb2_grpc.ExplorerServiceStub(channel).Evaluate(
            explorer_pb2.EvaluateRequest(), timeout=60
        )


async def test_explorer_steps_skips_syncs_and_resumes(make_config, service_process, tmp_path) -> None:
    tasks = tmp_path / "arith.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in taskset_rows()))
    eval_tasks = tmp_path / "eval.jsonl"
    eval_tasks.write_text("".join(json.dumps(r) + "\n" for r in generate(ArithSpec(), 3, seed=9)))
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "flaky.py").write_text(PLUGIN)
    config, data = make_config(
        {
            "mode": "both",
            "name": "explorer-it",
            "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
            "model": {"max_prompt_tokens": 32, "max_response_tokens": 6},
            "buffer": {
                "batch_size": 2,
                "explorer_input": {
                    "taskset": {
                        "name": "arith",
                        "storage_type": "file",
                        "path": str(tasks),
                        "default_workflow_type": "flaky_arith",
                        "format": {"prompt_key": "question", "response_key": "answer"},
                        "rollout_args": {"temperature": 0.0},
                    },
                    "eval_tasksets": [
                        {
                            "name": "eval_arith",
                            "storage_type": "file",
                            "path": str(eval_tasks),
                            "repeat_times": 2,
                            "default_workflow_type": "arith_workflow",
                            "format": {"prompt_key": "question", "response_key": "answer"},
                        }
                    ],
                },
            },
            "explorer": {
                "max_timeout": 2,
                "max_retry_times": 1,
                "runner_per_model": 4,
                "plugin_dirs": [str(plugins)],
                "eval_on_startup": False,
            },
            "synchronizer": {"sync_method": "checkpoint", "sync_interval": 2, "sync_timeout": 120},
            "monitor": {"monitor_type": "none"},
        }
    )
    cfg = load_config(str(config))
    address = {
        name: f"127.0.0.1:{data['services'][name]['port']}" for name in ("buffer", "synchronizer", "explorer")
    }
    service_process("buffer", config)
    service_process("synchronizer", config)
    await wait_healthy(address["buffer"], 60)
    await wait_healthy(address["synchronizer"], 60)

    buffer = await BufferClient.connect(address["buffer"])
    trainer = await SynchronizerClient.connect(address["synchronizer"])
    await trainer.register("trainer", "trainer")
    publisher = WeightPublisher(trainer, cfg)

    async def written(n: int):
        return (await buffer.stats("experience_buffer")).written >= n

    explorer = service_process("explorer", config)
    # steps 1 (2 tasks x 2) and 2 (the raising task skipped: 1 x 2); then the plan holds it for v2
    await wait_for(lambda: written(6), "steps 1-2", proc=explorer)
    v2 = perturbed(1)
    await publisher.publish(v2.state_dict(), 2)
    # step 3 (the hanging task skipped after 2 x 2 s) and step 4; then it reads batch 5 and waits for v4
    await wait_for(lambda: written(6 + 2 + 4), "steps 3-4", proc=explorer)

    async def held_for_v4():
        info = await explorer_info(address["explorer"])
        return info is not None and info.state == "waiting_for_sync" and info.stats["step"] == 4

    await wait_for(held_for_v4, "the explorer to wait for v4", proc=explorer)
    scores = await evaluate(address["explorer"])  # served while the step loop waits for the synchronizer
    assert scores.model_version == 2
    assert scores.scores["eval/eval_arith/tasks"] == 3 and "eval/eval_arith/accuracy/best@2" in scores.scores
    stop_process(explorer, sig=signal.SIGKILL, timeout=10)

    restarted = service_process("explorer", config)
    v4 = perturbed(2)
    await publisher.publish(v4.state_dict(), 4)
    assert await asyncio.to_thread(restarted.wait, 120) == 0, pathlib.Path(restarted.log_path).read_text()[
        -4000:
    ]

    batch = await buffer.read("experience_buffer", 100, max_wait=2)
    await buffer.ack(batch.lease_id)
    rest = await buffer.read("experience_buffer", 100, max_wait=0)
    assert rest.end_of_data and not rest.experiences  # the explorer closed its writer
    await buffer.close()
    await trainer.close()
    exps = batch.experiences
    by_step: dict[int, list] = {}
    for exp in exps:
        by_step.setdefault(exp.batch_id, []).append(exp)
    # batch 5 was read by the killed explorer before it could run it: the restart ran it again
    # (repeat_last), then batch 6; nothing was written twice
    assert {s: len(v) for s, v in sorted(by_step.items())} == {1: 4, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4}
    assert {e.model_version for e in by_step[1] + by_step[2]} == {0}
    assert {e.model_version for e in by_step[3] + by_step[4]} == {2}
    assert {e.model_version for e in by_step[5] + by_step[6]} == {4}
    log = pathlib.Path(explorer.log_path).read_text()
    assert log.count('"workflow_skipped"') == 2 and "injected failure" in log and "timed out after 2" in log

    base = load_causal_lm("builtin:tiny-arith")
    models = {0: base, 2: v2, 4: v4}
    published = load_checkpoint(str(pathlib.Path(cfg.run_dir) / "global_step_2"))
    torch.testing.assert_close(
        published["transformer.h.0.mlp.c_fc.weight"], v2.state_dict()["transformer.h.0.mlp.c_fc.weight"]
    )
    for exp in exps:
        assert exp.producer == "explorer" and exp.group_id and len(exp.logprobs) == exp.response_length
        recomputed = sequence_logprobs(models[exp.model_version], exp.tokens.tolist(), exp.prompt_length)
        np.testing.assert_allclose(recomputed, exp.logprobs, atol=1e-4)
    # the same prompt, greedy, before and after the weight update
    first_prompt = taskset_rows()[0]["question"]
    text = {e.model_version: e.response_text for e in exps if e.prompt_text == first_prompt}
    assert set(text) == {0, 2, 4} and text[0] != text[2]


async def test_explorer_receives_weights_over_a_gloo_group(make_config, service_process, tmp_path) -> None:
    """sync_method nccl on CPU: the trainer side broadcasts over gloo; the explorer loads before step 2."""
    tasks = tmp_path / "arith.jsonl"
    rows = generate(ArithSpec(), 4, seed=11)
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config, data = make_config(
        {
            "mode": "both",
            "name": "explorer-gloo",
            "algorithm": {"repeat_times": 2},
            "model": {"max_prompt_tokens": 32, "max_response_tokens": 4},
            "buffer": {
                "batch_size": 2,
                "explorer_input": {
                    "taskset": {
                        "name": "arith",
                        "storage_type": "file",
                        "path": str(tasks),
                        "default_workflow_type": "arith_workflow",
                        "format": {"prompt_key": "question", "response_key": "answer"},
                    }
                },
            },
            "explorer": {"eval_on_startup": False},
            "synchronizer": {"sync_method": "nccl", "sync_interval": 1, "sync_timeout": 60},
            "monitor": {"monitor_type": "none"},
        }
    )
    cfg = load_config(str(config))
    address = {name: f"127.0.0.1:{data['services'][name]['port']}" for name in ("buffer", "synchronizer")}
    service_process("buffer", config)
    service_process("synchronizer", config)
    await wait_healthy(address["buffer"], 60)
    await wait_healthy(address["synchronizer"], 60)
    trainer = await SynchronizerClient.connect(address["synchronizer"])
    await trainer.register("trainer", "trainer")
    buffer = await BufferClient.connect(address["buffer"])
    explorer = service_process("explorer", config)

    async def written(n: int):
        return (await buffer.stats("experience_buffer")).written >= n

    await wait_for(lambda: written(4), "step 1", proc=explorer)
    v1 = perturbed(3)
    await WeightPublisher(trainer, cfg).publish(v1.state_dict(), 1)  # returns once the explorer received it
    assert await asyncio.to_thread(explorer.wait, 120) == 0, pathlib.Path(explorer.log_path).read_text()[
        -4000:
    ]
    batch = await buffer.read("experience_buffer", 100, max_wait=2)
    await buffer.close()
    await trainer.close()
    models = {0: load_causal_lm("builtin:tiny-arith"), 1: v1}
    assert sorted((e.batch_id, e.model_version) for e in batch.experiences) == [(1, 0)] * 4 + [(2, 1)] * 4
    for exp in batch.experiences:
        recomputed = sequence_logprobs(models[exp.model_version], exp.tokens.tolist(), exp.prompt_length)
        np.testing.assert_allclose(recomputed, exp.logprobs, atol=1e-4)
