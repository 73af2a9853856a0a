"""`explorer:` — rollout engines and workflow runners (Trinity-RFT's keys)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from services.common.config.base import Section


class RolloutModelConfig(Section):
    engine_type: Literal["transformers", "vllm", "vllm_async"] = "transformers"
    """transformers (CPU/GPU, default) or vllm (GPU, optional extra)."""
    engine_num: int = Field(1, ge=1)
    """Inference engines."""
    tensor_parallel_size: int = Field(1, ge=1)
    """vLLM tensor parallelism."""
    enable_history: bool = False
    """Record model calls so a workflow can turn them into experiences."""
    enable_openai_api: bool = False
    """Serve an OpenAI-compatible HTTP API on loopback for agent code."""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """vLLM memory share."""
    dtype: str = "auto"
    """Engine dtype (auto: bf16 on GPU, fp32 on CPU)."""
    seed: int = 42
    """Sampling seed."""
    max_batch_size: int = Field(256, ge=1)
    """transformers: most sequences generated in one batch."""


class AuxiliaryModelConfig(Section):
    model_path: str
    """Hub id or local path."""
    engine_type: Literal["transformers", "vllm", "vllm_async"] = "transformers"
    """Engine."""
    engine_num: int = Field(1, ge=1)
    """Engines."""
    tensor_parallel_size: int = Field(1, ge=1)
    """vLLM tensor parallelism."""


class ExplorerConfig(Section):
    name: str = "explorer"
    """Member name (unique per explorer; a restart reuses it)."""
    runner_per_model: int = Field(8, ge=1)
    """Concurrent workflow runners per engine."""
    max_timeout: float = Field(900.0, gt=0)
    """Seconds a workflow may run before it is cancelled and retried."""
    max_retry_times: int = Field(2, ge=0)
    """Retries of a failing or hanging workflow before it is skipped."""
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
