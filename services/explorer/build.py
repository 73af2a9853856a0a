"""Build the explorer's parts from the config: engines, wrappers, runner (imports torch)."""

from __future__ import annotations

from typing import Any

from services.common.config.explorer import RolloutModelConfig
from services.common.config.schema import TrinityConfig
from services.common.logging import get_logger
from services.explorer.engines.base import BatchingEngine, EnginePool, InferenceEngine
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import VersionRef, WorkflowRunner

log = get_logger("explorer.build")


def pick_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def eos_ids(tokenizer: Any, model: Any = None) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(t) for t in extra)
    return sorted(ids)


def build_engine(
    cfg: TrinityConfig,
    tokenizer: Any,
    index: int,
    *,
    model_path: str | None = None,
    rollout: RolloutModelConfig | None = None,
) -> InferenceEngine:
    """An engine of `rollout`'s settings (default explorer.rollout_model) for `model_path` (default the policy)."""
    rm = rollout or cfg.explorer.rollout_model
    path = model_path or cfg.model.model_path
    dtype = rm.dtype if rm.dtype != "auto" else cfg.model.dtype
    if rm.engine_type in ("vllm", "vllm_async"):
        from services.explorer.engines.vllm_engine import VLLMEngine, VLLMSettings

        settings = VLLMSettings(
            tensor_parallel_size=rm.tensor_parallel_size,
            gpu_memory_utilization=rm.gpu_memory_utilization,
            dtype=dtype,
            seed=rm.seed + index,
            max_model_len=rm.max_model_len or cfg.model.effective_max_model_len,
            max_batch_size=rm.max_batch_size,
            enforce_eager=rm.enforce_eager,
            enable_prefix_caching=rm.enable_prefix_caching,
            enable_chunked_prefill=rm.enable_chunked_prefill,
            kv_cache_memory_gib=rm.kv_cache_memory_gib,
            process_mode=rm.process_mode,
            eos_token_ids=tuple(eos_ids(tokenizer)),
            extra_engine_args=dict(rm.extra_engine_args),
        )
        return VLLMEngine(path, settings)
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.models.loading import context_length, load_causal_lm

    model = load_causal_lm(path, dtype=dtype, device=pick_device(), seed=cfg.model.seed)
    log.info(
        "rollout_engine_built",
        engine="transformers",
        index=index,
        device=str(model.device),
        dtype=str(model.dtype),
    )
    limit = context_length(model)
    if limit is not None and cfg.model.effective_max_model_len > limit:
        log.warning(
            "context_longer_than_model",
            field="model.max_model_len",
            configured=cfg.model.effective_max_model_len,
            model_positions=limit,
            effect="responses stop at the model's last position (finish_reason length)",
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return TransformersEngine(
        model,
        eos_token_ids=eos_ids(tokenizer, model),
        pad_token_id=pad,
        max_batch_size=rm.max_batch_size,
        seed=rm.seed + index,
    )


def build_pool(cfg: TrinityConfig, tokenizer: Any) -> EnginePool:
    rm = cfg.explorer.rollout_model
    return EnginePool(
        [
            BatchingEngine(
                build_engine(cfg, tokenizer, i),
                max_batch_size=rm.max_batch_size,
                name=f"engine-{i}",
                log_requests=rm.enable_log_requests,
            )
            for i in range(rm.engine_num)
        ]
    )


def context_len(cfg: TrinityConfig, engine: Any) -> int:
    """Tokens of prompt + response a rollout may hold: the vLLM engine's max_model_len, or
    model.max_model_len (default max_prompt_tokens + max_response_tokens) within the positions of a
    transformers engine's model. Prompts kept whole (enable_prompt_truncation false) fit in it."""
    rm = cfg.explorer.rollout_model
    if rm.engine_type in ("vllm", "vllm_async"):
        return rm.max_model_len or cfg.model.effective_max_model_len
    limit = getattr(getattr(engine, "engine", engine), "context_limit", None)
    configured = cfg.model.effective_max_model_len
    return configured if limit is None else min(configured, int(limit))


def build_runner(
    cfg: TrinityConfig, pool: EnginePool, tokenizer: Any, version: VersionRef, auxiliary: list[Any]
) -> WorkflowRunner:
    rm = cfg.explorer.rollout_model

    def wrapper(i: int) -> ModelWrapper:
        return ModelWrapper(
            pool[i % len(pool)],
            tokenizer,
            max_prompt_tokens=cfg.model.max_prompt_tokens,
            max_response_tokens=cfg.model.max_response_tokens,
            min_response_tokens=cfg.model.min_response_tokens,
            enable_history=rm.enable_history,
            chat_template=cfg.model.custom_chat_template,
            enable_thinking=rm.enable_thinking,
            tool_call_parser=rm.tool_call_parser,
            reasoning_parser=rm.reasoning_parser,
            version_fn=version,
            model_name=cfg.model.model_path,
            api_key=rm.api_key,
            api_port=None if rm.base_port is None else rm.base_port + i,
            enable_prompt_truncation=cfg.model.enable_prompt_truncation,
            max_model_len=context_len(cfg, pool[i % len(pool)]),
        )

    return WorkflowRunner(
        wrapper,
        slots=cfg.explorer.runner_per_model * len(pool),
        max_timeout=cfg.explorer.max_timeout,
        max_retry_times=cfg.explorer.max_retry_times,
        version_fn=version,
        auxiliary_models=auxiliary,
        max_repeat_times_per_runner=cfg.explorer.max_repeat_times_per_runner,
    )


def build_external_runner(cfg: TrinityConfig) -> WorkflowRunner:
    """mode bench with model.external_model: every runner slot asks the remote chat API."""
    from services.explorer.external_model import ExternalChatModel

    remote = ExternalChatModel.from_config(cfg.model)
    log.info("external_model", base_url=remote.base_url, model=remote.model_name)
    return WorkflowRunner(
        lambda i: remote,
        slots=cfg.explorer.runner_per_model * cfg.explorer.rollout_model.engine_num,
        max_timeout=cfg.explorer.max_timeout,
        max_retry_times=cfg.explorer.max_retry_times,
        version_fn=VersionRef(0),
        auxiliary_models=[],
        max_repeat_times_per_runner=cfg.explorer.max_repeat_times_per_runner,
    )


def build_auxiliary(cfg: TrinityConfig) -> tuple[list[Any], list[Any]]:
    """ModelWrappers of explorer.auxiliary_models; returns (wrappers, closables).

    Workflows get each as an OpenAI client served on loopback (`auxiliary_models`) and as the
    wrapper itself (`auxiliary_model_wrappers`: chat, teacher logprobs)."""
    from services.models.loading import load_tokenizer

    wrappers: list[Any] = []
    owned: list[Any] = []
    for i, aux in enumerate(cfg.explorer.auxiliary_models):
        tokenizer = load_tokenizer(aux.model_path)
        rollout = aux.engine_config(cfg.explorer.rollout_model)
        engine = BatchingEngine(
            build_engine(cfg, tokenizer, 1000 + i, model_path=aux.model_path, rollout=rollout),
            name=f"aux-{i}",
            log_requests=rollout.enable_log_requests,
        )
        wrapper = ModelWrapper(
            engine,
            tokenizer,
            max_prompt_tokens=aux.max_prompt_tokens or cfg.model.max_prompt_tokens,
            max_response_tokens=aux.max_response_tokens or cfg.model.max_response_tokens,
            enable_thinking=aux.enable_thinking,
            tool_call_parser=rollout.tool_call_parser,
            reasoning_parser=rollout.reasoning_parser,
            model_name=aux.model_path,
            api_key=aux.api_key,
            api_port=aux.base_port,
        )
        wrapper.get_openai_client()  # serve it now, not from the first workflow's thread
        wrappers.append(wrapper)
        owned.extend([wrapper, engine])
    return wrappers, owned
