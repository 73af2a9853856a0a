"""Runs inside vLLM's worker processes: mixed into vLLM's worker class (`worker_extension_cls`).

vLLM calls these methods by name through `LLM.collective_rpc`, in whichever process the worker
lives (the explorer's own with `process_mode: in_process`, an engine-core child otherwise), so
nothing here may rely on the explorer's state. (Imports: see the end of this docstring.)

- `trinity_update_weights`: new weights in the checkpoint (Hugging Face) layout, through the
  worker's `reload_weights`, which re-runs vLLM's post-load processing (on CPU the linear layers are
  repacked after loading, so a bare `model.load_weights` of a full state dict fails). Across process
  boundaries tensors must travel as bytes (a safetensors blob): collective_rpc delivers tensors to a
  child process as plain lists.
- `trinity_tempered_logprobs`: makes the logprobs vLLM reports for a sampled token the log-softmax
  of the *tempered, unfiltered* logits, log softmax(logits / T)[token], which is what the trainer
  recomputes from a forward pass. vLLM's `processed_logprobs` are taken after its logits processors
  (min_tokens bans EOS), top-k / top-p filtering and renormalization (up to 0.1 away per token);
  its `raw_logprobs` ignore temperature. The wrapper takes the log-softmax of logits / T just before
  the processors run (T = 1 for greedy rows, as the transformers engine reports for temperature 0)
  and hands it out as the sampler's processed logprobs.
- `trinity_quiet_reload_warnings`: vLLM's layerwise reload (what `reload_weights` runs) logs
  "<Module class>: Failed to load weights" for every module that holds tensors but was loaded
  nothing, on every push. For a full push those are exactly the modules with no weights of their
  own in a checkpoint (`modules_without_own_weights`): a tied lm_head (ParallelLMHead, whose weight
  *is* embed_tokens' weight, updated in place through the embedding) and RotaryEmbedding (only its
  cos/sin cache, computed from the config; one module shared by every layer). vLLM puts their
  tensors back as they were. On CPU that alone left the tied head stale (its matmul uses a copy
  packed at load time): `trinity_update_weights` re-packs it after each reload
  (`repack_tied_modules`), and then the warnings are benign (tests/vllm/test_reload_warnings.py).
  Those lines, and only those, go to the service's log with one line saying why
  (services.common.logging.log_benign), not to `trinity run`'s console; a class that does own
  weights keeps its warning on the console.

- `trinity_load_shared`: mode colocate; the same reload, from the trainer's shared weights, which
  this process maps itself (services/synchronizer/transfer/shared.py): only a path crosses over.

Only torch, safetensors, vLLM, services.common.logging (structlog) and, for colocate, the
synchronizer's shared-weights module (torch only) are imported.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
RELOAD_FAILED = "%s: Failed to load weights"
RELOAD_WHY = (
    "vLLM's layerwise weight reload logs '<Module>: Failed to load weights' on every weight push for each "
    "module that holds tensors but gets none from the pushed state dict. Here these are modules with no "
    "weights of their own in a checkpoint: a tied lm_head (ParallelLMHead) shares embed_tokens' weight, "
    "which the push updates in place (and which the worker re-packs for the head's matmul after each "
    "push), and RotaryEmbedding holds only its cos/sin cache, computed from the model config. The engine "
    "serves exactly the pushed weights (tests/vllm/test_reload_warnings.py). Kept in this log, off "
    "trinity run's console"
)
# the classes whose reload warning is benign for the model being reloaded now (set by trinity_update_weights)
_QUIET_CLASSES: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "trinity_quiet_reload_classes", default=frozenset()
)


def modules_without_own_weights(model: Any) -> dict[str, str]:
    """{qualified name: class name} of the modules of a vLLM model that hold tensors but take none from
    a checkpoint: only buffers (RotaryEmbedding's cos_sin_cache), or only parameters that an earlier
    module owns (a tied lm_head). vLLM's attention layers, finalized apart, are left out, as in vLLM.

    The order is vLLM's: of two modules sharing a parameter, the first in `model.modules()` gets the
    loads and the later one is reported.
    """
    try:
        from vllm.model_executor.layers.attention import is_deferred_attention_layer
    except ImportError:  # another vLLM layout: no attention layer is told apart

        def is_deferred_attention_layer(layer: Any) -> bool:
            return False

    seen: set[int] = set()
    found: dict[str, str] = {}
    for name, module in model.named_modules():
        params = [p for p in module._parameters.values() if p is not None]
        buffers = [b for b in module._buffers.values() if b is not None]
        if not params and not buffers:
            continue
        own = [p for p in params if id(p) not in seen]
        seen.update(id(p) for p in params)
        if not own and not is_deferred_attention_layer(module):
            found[name] = type(module).__name__
    return found


def repack_tied_modules(model: Any) -> list[str]:
    """Re-run the post-load processing of the modules whose parameters another module owns (a tied
    lm_head); returns their names.

    vLLM's CPU build packs a ParallelLMHead's matmul weight at load time
    (UnquantizedEmbeddingMethod.process_weights_after_loading -> dispatch_cpu_unquantized_gemm: a
    oneDNN handle or a packed copy). Its layerwise reload re-processes only the modules it loaded
    tensors into, and a tied head gets none (its weight is embed_tokens'), so without this the head
    keeps multiplying by the packed copy of the *first* weights: the embedding updates, the output
    head does not. Only the unquantized method is re-run (it packs from the shared weight without
    changing it); on GPU it does nothing.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    done = []
    for name in modules_without_own_weights(model):
        module = model.get_submodule(name)
        method = getattr(module, "quant_method", None)
        if any(p is not None for p in module._parameters.values()) and isinstance(
            method, UnquantizedEmbeddingMethod
        ):
            method.process_weights_after_loading(module)
            done.append(name)
    return done


def quiet_classes(model: Any) -> frozenset[str]:
    """The classes of `modules_without_own_weights` none of whose modules owns weights: a class that
    has one (an untied lm_head beside a tied one) keeps its warning, that module missed an update."""
    without = modules_without_own_weights(model)
    owning = {
        type(m).__name__
        for name, m in model.named_modules()
        if name not in without and any(p is not None for p in m._parameters.values())
    }
    return frozenset(set(without.values()) - owning)


class BenignReloadWarnings(logging.Filter):
    """On vLLM's reload logger: "<class>: Failed to load weights" of a class benign for the model being
    reloaded (_QUIET_CLASSES, set during trinity_update_weights) goes to log_benign (the service's
    log, not the console); every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg != RELOAD_FAILED or len(args) != 1 or args[0] not in _QUIET_CLASSES.get():
            return True
        from services.common.logging import log_benign

        log_benign(
            "vllm_reload_warning",
            RELOAD_WHY,
            message=record.getMessage(),
            source=f"{record.name}:{record.lineno}",
            source_level=record.levelname,
        )
        return False


class TrinityWorkerExtension:
    """Methods added to vLLM's worker; `self` is the worker (it has `model_runner`)."""

    model_runner: Any
    _trinity_quiet_classes: frozenset[str]

    def trinity_update_weights(self, weights: bytes | list[tuple[str, Any]]) -> int:
        """Load `weights` (a safetensors blob, or (name, tensor) pairs in-process); returns how many."""
        if isinstance(weights, bytes):
            from safetensors.torch import load

            pairs = list(load(weights).items())
        else:
            pairs = list(weights)
        reload = getattr(self, "reload_weights", None) or self.model_runner.reload_weights
        token = _QUIET_CLASSES.set(getattr(self, "_trinity_quiet_classes", frozenset()))
        try:
            reload(weights_iterator=iter(pairs))
        finally:
            _QUIET_CLASSES.reset(token)
        repack_tied_modules(self.model_runner.model)  # the tied head serves the pushed embedding
        return len(pairs)

    def trinity_load_shared(self, directory: str, skip: list[str]) -> int:
        """mode colocate: reload from the trainer's shared weights in `directory` (names in `skip` left
        out); returns how many tensors. The files are mapped once per directory, in this process,
        and the mapping kept: the trainer updates them in place, so each later load reads the new
        values from the same pages (under the lock the explorer holds around the load)."""
        cached: tuple[str, list[tuple[str, Any]]] | None = getattr(self, "_trinity_shared", None)
        if cached is None or cached[0] != directory:
            from services.synchronizer.transfer.shared import mapped_tensors

            cached = (directory, [(n, t) for n, t in mapped_tensors(directory) if n not in skip])
            self._trinity_shared = cached
        return self.trinity_update_weights(cached[1])

    def trinity_quiet_reload_warnings(self) -> list[str]:
        """From now on, reload warnings of `quiet_classes(model)` go to the log, not the console (see
        the module docstring); returns those classes, sorted."""
        self._trinity_quiet_classes = quiet_classes(self.model_runner.model)
        logger = logging.getLogger(RELOAD_LOGGER)
        if not any(isinstance(f, BenignReloadWarnings) for f in logger.filters):
            logger.addFilter(BenignReloadWarnings())
        return sorted(self._trinity_quiet_classes)

    def trinity_tempered_logprobs(self) -> bool:
        """Wrap the sampler once (see the module docstring); True when installed."""
        import torch

        sampler = self.model_runner.sampler
        if getattr(sampler, "_trinity_tempered", False):
            return True
        apply_processors, sample = sampler.apply_logits_processors, sampler.sample
        stash: dict[str, torch.Tensor] = {}

        def apply_logits_processors(logits: torch.Tensor, metadata: Any, *args: Any, **kwargs: Any) -> Any:
            # before min_tokens / bias / penalties touch the logits: log softmax(logits / T), greedy rows T = 1
            temperature = metadata.temperature
            if temperature is None:
                scaled = logits.float()
            else:
                t = torch.where(temperature < 1e-5, torch.ones_like(temperature), temperature)
                scaled = logits.float() / t.to(logits.device, torch.float32)[:, None]
            stash["logprobs"] = scaled.log_softmax(dim=-1)
            return apply_processors(logits, metadata, *args, **kwargs)

        def sample_with_logprobs(logits: torch.Tensor, metadata: Any, *args: Any, **kwargs: Any) -> Any:
            sampled, _ = sample(logits, metadata, *args, **kwargs)
            return sampled, stash.pop("logprobs", None)

        sampler.apply_logits_processors = apply_logits_processors
        sampler.sample = sample_with_logprobs
        sampler._trinity_tempered = True
        return True
