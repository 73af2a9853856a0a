"""The vLLM engine with its engine core in a child process (vLLM's default on GPU): weights travel as
a safetensors blob, also when pushed mid-generation (partial rollouts); shared weights in mode
colocate: only their directory; a dead engine process is reported, naming the cause.

The checks run in a fresh interpreter (this file as a script): vLLM's process-level switches, once an
in-process engine has run in the pytest process, do not go back to multiprocess there."""

from __future__ import annotations

import copy
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from services.common.errors import Unavailable
from services.explorer.engines.base import SamplingParams
from services.explorer.engines.vllm_engine import VLLMEngine, VLLMSettings
from services.models.loading import builtin_tokenizer
from services.synchronizer.transfer.shared import share_parameters
from tests.conftest import REPO
from tests.vllm.conftest import build_tiny_llama
from tests.vllm.test_engine import PROMPTS, hf_greedy, hf_logprobs
from tests.vllm.test_partial_rollouts import check_push_mid_generation


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry))
    return found


def check_multiprocess_engine(path: pathlib.Path) -> None:
    model = build_tiny_llama(path)
    eos = builtin_tokenizer().eos_token_id
    settings = VLLMSettings(
        dtype="float32", max_model_len=256, process_mode="multiprocess", eos_token_ids=(eos,)
    )
    engine = VLLMEngine(str(path), settings)
    try:
        assert not engine.in_process
        params = SamplingParams(n=2, temperature=0.8, top_k=6, top_p=0.9, max_tokens=16)
        for prompt, samples in zip(PROMPTS, engine.generate_batch(PROMPTS, params), strict=True):
            for s in samples:
                ref = hf_logprobs(model, prompt, s.response_ids.tolist(), 0.8)
                assert float(np.abs(ref - s.logprobs).mean()) < 1e-3
        state = {k: v.clone() for k, v in model.state_dict().items()}
        gen = torch.Generator().manual_seed(3)
        engine.update_weights(((k, v + 0.05 * torch.randn(v.shape, generator=gen)) for k, v in state.items()))
        perturbed = [
            g[0].response_ids.tolist()
            for g in engine.generate_batch(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8))
        ]
        engine.update_weights(state.items())
        restored = [
            g[0].response_ids.tolist()
            for g in engine.generate_batch(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8))
        ]
        assert restored == [hf_greedy(model, p, 8) for p in PROMPTS] and perturbed != restored
        # partial rollouts: the engine core runs ahead of the step loop here; the rows still go on
        # from the tokens they hold (test_partial_rollouts.py)
        check_push_mid_generation(engine, model, lockstep=False)

        # mode colocate: only the directory crosses to the engine core, which maps the files itself
        trainer = copy.deepcopy(model)
        with torch.no_grad():
            for param in trainer.parameters():
                param.add_(0.05 * torch.randn(param.shape, generator=gen))
        share_parameters(trainer, str(path.parent / "shared"), 1)
        engine.load_shared(str(path.parent / "shared"))
        shared = [
            g[0].response_ids.tolist()
            for g in engine.generate_batch(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8))
        ]
        assert shared == [hf_greedy(trainer, p, 8) for p in PROMPTS] and shared != restored

        engine_processes = children(os.getpid())  # vLLM's engine core (this test starts no other child)
        assert engine_processes
        for child in engine_processes:
            os.kill(child, signal.SIGKILL)
        time.sleep(1.0)
        with pytest.raises(Unavailable, match="vLLM's engine process"):
            engine.generate_batch(PROMPTS, SamplingParams(temperature=0.0, max_tokens=4))
    finally:
        engine.close()


@pytest.mark.timeout(300)
def test_multiprocess_engine_samples_updates_and_reports_its_death(tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.vllm.test_multiprocess", str(tmp_path / "model")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0 and "multiprocess checks passed" in done.stdout, (
        done.stdout[-3000:] + done.stderr[-5000:]
    )


if __name__ == "__main__":
    check_multiprocess_engine(pathlib.Path(sys.argv[1]))
    print("multiprocess checks passed")
