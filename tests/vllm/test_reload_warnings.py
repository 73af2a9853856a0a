"""vLLM's "<Module>: Failed to load weights" warnings on a weight push are benign, and stay off the console.

vLLM's layerwise reload (what our push runs, vllm_worker.py) warns for every module that holds tensors
but was loaded nothing. On a tied Llama (as SmolLM2) these are RotaryEmbedding (only a cos/sin cache
buffer) and ParallelLMHead (its weight *is* embed_tokens' weight; the engine does not push lm_head.weight
for a tied model). Shown here: vLLM names exactly the modules that no pushed tensor feeds; after the
push the engine serves the pushed weights (the tied lm_head included: the reference that keeps the old
head is not what it serves); the lines reach the service log once explained, never vLLM's console handler.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from structlog.testing import capture_logs

import services.common.logging as trinity_logging
from services.common.logging import THIRD_PARTY_EVENT, THIRD_PARTY_WHY_EVENT
from services.explorer.engines.base import SamplingParams
from services.explorer.engines.vllm_engine import VLLMEngine, VLLMSettings
from services.explorer.engines.vllm_worker import RELOAD_LOGGER
from services.models.loading import builtin_tokenizer
from tests.vllm.conftest import build_tiny_llama
from tests.vllm.test_engine import hf_greedy, hf_logprobs

TOK = builtin_tokenizer()
PROMPTS = [TOK("12+34=")["input_ids"], TOK("hello")["input_ids"]]
FAILED = ": Failed to load weights"


@pytest.fixture(scope="session")
def tied_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("tied-llama")
    return path, build_tiny_llama(path, seed=3, tied=True)


# Session-scoped like conftest's tiny_engine: closing an in-process vLLM engine tears down vLLM's global
# parallel state, which another in-process engine still in use (tiny_engine, below) needs.
@pytest.fixture(scope="session")
def tied_engine(tied_llama: tuple[pathlib.Path, torch.nn.Module]) -> Iterator[VLLMEngine]:
    path, _ = tied_llama
    engine = VLLMEngine(
        str(path),
        VLLMSettings(
            dtype="float32",
            max_model_len=256,
            process_mode="in_process",
            eos_token_ids=(TOK.eos_token_id,),
            kv_cache_memory_gib=0.25,
        ),
    )
    yield engine
    engine.close()


class _Records(logging.Filter):
    """Each record once, however many handlers it passes (vLLM's logger may hold several after other
    tests configured logging in this process)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self._records: list[logging.LogRecord] = []  # kept alive, so identity stays unique

    def filter(self, record: logging.LogRecord) -> bool:
        if not any(seen is record for seen in self._records):
            self._records.append(record)
            self.messages.append(record.getMessage())
        return True


@contextmanager
def reload_records() -> Iterator[tuple[list[str], list[str]]]:
    """(what vLLM's reload logger logged, what reached the handlers of vLLM's logger, i.e. its console)."""
    logger, root = logging.getLogger(RELOAD_LOGGER), logging.getLogger("vllm")
    logged, handled = _Records(), _Records()
    logger.filters.insert(0, logged)  # before ours: every record vLLM makes
    for handler in root.handlers:
        handler.addFilter(handled)
    try:
        yield logged.messages, handled.messages
    finally:
        logger.removeFilter(logged)
        for handler in root.handlers:
            handler.removeFilter(handled)


def inventory(worker: Any) -> dict[str, Any]:
    """Runs in vLLM's worker: each module holding tensors, and vLLM's own packed-name mapping."""
    from vllm.model_executor.layers.attention import is_deferred_attention_layer

    model = worker.model_runner.model
    modules = []
    for name, module in model.named_modules():  # shared modules once, as vLLM's reload walks them
        params = {n: id(p) for n, p in module._parameters.items() if p is not None}
        buffers = sorted(n for n, b in module._buffers.items() if b is not None)
        if (params or buffers) and not is_deferred_attention_layer(module):
            modules.append((name, type(module).__name__, params, buffers))
    return {"modules": modules, "packed": dict(getattr(model, "packed_modules_mapping", {}))}


def fed_by(pushed: list[str], packed: dict[str, list[str]]) -> set[str]:
    """vLLM module names the pushed checkpoint names load into (q/k/v_proj -> qkv_proj, ...)."""
    rename = {part: whole for whole, parts in packed.items() for part in parts}
    fed = set()
    for name in pushed:
        *path, module_part, _ = name.split(".")
        fed.add(".".join([*path, rename.get(module_part, module_part)]))
    return fed


def pushed_names(engine: VLLMEngine, state: dict[str, torch.Tensor]) -> list[str]:
    return [n for n in state if not (engine.tied and n == "lm_head.weight")]  # as update_weights sends


def test_vllm_names_exactly_the_modules_the_push_has_no_weights_for(tied_engine, tied_llama) -> None:
    _, model = tied_llama
    state = {k: v.clone() for k, v in model.state_dict().items()}
    info = tied_engine.llm.collective_rpc(inventory)[0]
    fed = fed_by(pushed_names(tied_engine, state), info["packed"])
    unfed = [(name, cls) for name, cls, _, _ in info["modules"] if name not in fed]
    by_name = {name: (cls, params, buffers) for name, cls, params, buffers in info["modules"]}
    # every module that owns parameters is fed, but the tied head; the rotary module holds only a buffer
    assert sorted(cls for _, cls in unfed) == ["ParallelLMHead", "RotaryEmbedding"]
    for name, cls in unfed:
        _, params, buffers = by_name[name]
        if cls == "ParallelLMHead":
            assert params == {"weight": by_name["model.embed_tokens"][1]["weight"]}  # the same tensor
        else:
            assert params == {} and buffers == ["cos_sin_cache"]
    assert not any("rotary" in n or n.startswith("lm_head") for n in pushed_names(tied_engine, state))

    with reload_records() as (logged, handled):
        tied_engine.update_weights(state.items())
    assert sorted(logged) == sorted(f"{cls}{FAILED}" for _, cls in unfed)
    assert not [m for m in handled if FAILED in m]  # vLLM's console handler saw none of them
    assert tied_engine.quiet_reload_classes == ["ParallelLMHead", "RotaryEmbedding"]


def test_after_a_push_the_engine_serves_the_pushed_weights_tied_head_included(
    tied_engine, tied_llama
) -> None:
    _, model = tied_llama
    state = {k: v.clone() for k, v in model.state_dict().items()}
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    base = [g[0].response_ids.tolist() for g in tied_engine.generate_batch(PROMPTS, greedy)]
    gen = torch.Generator().manual_seed(5)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]  # one tensor in a tied model
    try:
        tied_engine.update_weights(perturbed.items())
        model.load_state_dict(perturbed)
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        out = tied_engine.generate_batch(PROMPTS, greedy)
        ids = [g[0].response_ids.tolist() for g in out]
        assert ids == [hf_greedy(model, p, 8) for p in PROMPTS] and ids != base
        sequences = [p + i for p, i in zip(PROMPTS, ids, strict=True)]
        for seq, got in zip(sequences, tied_engine.score_batch(sequences), strict=True):
            np.testing.assert_allclose(got, hf_logprobs(model, seq[:1], seq[1:], 1.0), atol=1e-4)
        # had vLLM kept the old head, it would serve this model's logits instead, which are far off
        stale = build_tiny_llama(pathlib.Path(tied_engine.model_path).parent / "stale", seed=3, tied=False)
        stale.load_state_dict({**perturbed, "lm_head.weight": state["model.embed_tokens.weight"]})
        seq = sequences[0]
        stale_lps = hf_logprobs(stale, seq[:1], seq[1:], 1.0)
        assert np.abs(tied_engine.score_batch([seq])[0] - stale_lps).max() > 1e-2
    finally:
        model.load_state_dict(state)
        tied_engine.update_weights(state.items())
    restored = tied_engine.generate_batch(PROMPTS, greedy)
    assert [g[0].response_ids.tolist() for g in restored] == [hf_greedy(model, p, 8) for p in PROMPTS]


def test_the_warnings_go_to_the_log_with_one_line_saying_why(tied_engine, tied_llama) -> None:
    _, model = tied_llama
    trinity_logging._explained.discard("vllm_reload_warning")  # as in a fresh process
    with capture_logs() as logs:
        for _ in range(2):
            tied_engine.update_weights(model.state_dict().items())
    why = [e for e in logs if e["event"] == THIRD_PARTY_WHY_EVENT]
    assert len(why) == 1 and why[0]["kind"] == "vllm_reload_warning"
    assert "tied lm_head" in why[0]["why"] and "RotaryEmbedding" in why[0]["why"]
    quiet = [e for e in logs if e["event"] == THIRD_PARTY_EVENT]
    assert sorted(e["message"] for e in quiet) == sorted(
        [f"ParallelLMHead{FAILED}", f"RotaryEmbedding{FAILED}"] * 2
    )
    assert all(e["source_level"] == "WARNING" for e in quiet)


def test_an_untied_head_keeps_its_warning_on_the_console(tiny_engine, tiny_llama) -> None:
    """The untied tiny Llama: ParallelLMHead owns its weight, so a push without it is a real miss."""
    _, model = tiny_llama
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert tiny_engine.quiet_reload_classes == ["RotaryEmbedding"]
    with reload_records() as (logged, handled):
        tiny_engine.update_weights((k, v) for k, v in state.items() if k != "lm_head.weight")
    assert sorted(logged) == [f"ParallelLMHead{FAILED}", f"RotaryEmbedding{FAILED}"]
    assert [m for m in handled if FAILED in m] == [f"ParallelLMHead{FAILED}"]
