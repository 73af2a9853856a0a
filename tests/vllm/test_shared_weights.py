"""mode colocate with vLLM: the engine copies each version from the trainer's shared weights
(VLLMEngine.load_shared; services/synchronizer/transfer/shared.py). It serves exactly the shared
values, keeps its own copy (the trainer changing the files in place changes nothing until the next
load), and a manifest that does not fit the model is refused before vLLM sees it."""

from __future__ import annotations

import copy
import json
import pathlib

import numpy as np
import pytest
import torch

from services.common.errors import InvalidArgument
from services.explorer.engines.vllm_engine import VLLMEngine
from services.synchronizer.transfer.shared import MANIFEST, share_parameters
from tests.vllm.test_engine import PROMPTS, greedy, hf_greedy, hf_logprobs


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=gen))


def expect(engine: VLLMEngine, model: torch.nn.Module) -> None:
    """The engine's greedy answers and logprobs are `model`'s."""
    for prompt, (ids, lps) in zip(PROMPTS, greedy(engine), strict=True):
        assert ids == hf_greedy(model, prompt, 8)
        torch.testing.assert_close(
            torch.from_numpy(lps), torch.from_numpy(hf_logprobs(model, prompt, ids, 1.0)), atol=1e-4, rtol=0
        )


def test_the_engine_serves_the_shared_weights_and_keeps_its_own_copy(
    tiny_engine: VLLMEngine, tiny_llama: tuple[pathlib.Path, torch.nn.Module], tmp_path: pathlib.Path
) -> None:
    _, base = tiny_llama
    trainer = copy.deepcopy(base)  # the trainer's policy: its parameters move into the shared files
    perturb(trainer, 11)
    directory = str(tmp_path / "shared")
    size = share_parameters(trainer, directory, 1)
    try:
        assert tiny_engine.load_shared(directory) == size
        expect(tiny_engine, trainer)
        before = greedy(tiny_engine)
        perturb(trainer, 12, 0.2)  # the optimizer's in-place update lands in the shared files
        after = greedy(tiny_engine)
        assert [ids for ids, _ in after] == [ids for ids, _ in before]  # vLLM still serves its copy
        assert tiny_engine.load_shared(directory) == size  # the next version: the same mapping, new values
        expect(tiny_engine, trainer)
        assert [ids for ids, _ in greedy(tiny_engine)] != [ids for ids, _ in before]
    finally:
        tiny_engine.update_weights(base.state_dict().items())


def test_a_manifest_that_does_not_fit_the_model_is_refused_and_the_engine_serves_on(
    tiny_engine: VLLMEngine, tiny_llama: tuple[pathlib.Path, torch.nn.Module], tmp_path: pathlib.Path
) -> None:
    _, base = tiny_llama
    served = greedy(tiny_engine)
    other = copy.deepcopy(base)
    directory = tmp_path / "shared"
    share_parameters(other, str(directory), 1)
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["parameters"][1]["shape"] = [3, 3]
    (directory / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InvalidArgument, match="shape"):
        tiny_engine.load_shared(str(directory))
    with pytest.raises(Exception, match="no shared weights"):
        tiny_engine.load_shared(str(tmp_path / "nowhere"))
    for (ids, lps), (ids2, lps2) in zip(served, greedy(tiny_engine), strict=True):
        assert ids == ids2 and np.array_equal(lps, lps2)  # nothing of the refused load applied
