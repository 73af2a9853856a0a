"""`model:` — the model being trained and token limits (Trinity-RFT's keys)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from services.common.config.base import Section, read_file_key
from services.common.config.lora import LoRAConfig


class TinkerConfig(Section):
    """Trinity's `model.tinker` (training on a remote Tinker / TuFT service): checked key by key;
    `enable: true` is refused (this project trains locally), so the others change nothing here."""

    enable: bool = False
    """Train on a Tinker service: refused (the trainer here trains the model locally with torch)."""
    rank: int = Field(16, ge=1)
    """Tinker's LoRA rank (local LoRA here: model.lora_configs)."""
    seed: int | None = None
    """Tinker's seed."""
    train_mlp: bool = True
    """Tinker's LoRA on the MLP layers."""
    train_attn: bool = True
    """Tinker's LoRA on the attention layers."""
    train_unembed: bool = True
    """Tinker's LoRA on the unembedding."""
    base_url: str | None = None
    """URL of the Tinker service."""
    server_loss_fn: str | None = None
    """TuFT's server-side loss name (Trinity's TuFT examples)."""
    forward_backward_chunk_bytes: int | None = Field(None, ge=1)
    """TuFT's request size per forward/backward chunk (Trinity's TuFT examples)."""


class ExternalModelConfig(Section):
    """Trinity's `model.external_model`: score a remote OpenAI-compatible chat API in `mode: bench`
    (services/explorer/external_model.py). The explorer then loads no model: workflows' chat calls go
    to `<base url>/chat/completions` as `model_name` and get text back (no token ids, so nothing here
    can be trained on; other modes refuse it)."""

    enable: bool = False
    """Evaluate the remote model instead of model_path (mode bench only)."""
    base_url_env: str = "OPENAI_BASE_URL"
    """Environment variable holding the API's base URL (e.g. http://host:8000/v1), read by the explorer."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key (unset: no Authorization header)."""
    model_name: str | None = None
    """The remote model's name in requests (default: model.model_path)."""


class ModelConfig(Section):
    model_path: str = "builtin:tiny-arith"
    """Hub id or local path of a causal LM; `builtin:<name>` builds a tiny model locally (no download):
    builtin:tiny-arith (GPT-2, 0.6M parameters) or builtin:tiny-30m (29M); see services/models/loading.py."""
    tokenizer_path: str | None = None
    """Tokenizer location when it differs from model_path."""
    critic_model_path: str | None = None
    """Critic (value) model; defaults to model_path."""
    max_model_len: int | None = Field(None, ge=1)
    """Max tokens of prompt + response; defaults to max_prompt_tokens + max_response_tokens."""
    max_prompt_tokens: int = Field(1024, ge=1)
    """Prompts longer than this are truncated from the left."""
    max_response_tokens: int = Field(512, ge=1)
    """Max generated tokens per response."""
    min_response_tokens: int = Field(1, ge=0)
    """Min generated tokens per response."""
    chat_template_path: str | None = None
    """A file holding a Jinja chat template, read into custom_chat_template (give one of the two)."""
    custom_chat_template: str | None = None
    """Jinja chat template overriding the tokenizer's."""
    dtype: str = "auto"
    """Weights dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16."""
    seed: int = 42
    """Seed for building builtin models and for sampling."""
    temperature: float | None = Field(None, ge=0)
    """Rollout temperature of every taskset whose rollout_args give none (Trinity's model.temperature)."""
    top_p: float | None = Field(None, gt=0, le=1)
    """Rollout top_p of every taskset whose rollout_args give none."""
    top_k: int | None = None
    """Rollout top_k of every taskset whose rollout_args give none (-1 or 0: off)."""
    logprobs: int | None = Field(None, ge=0)
    """Rollout logprobs of every taskset whose rollout_args give none (the sampled token's logprob is
    always kept; more are not returned)."""
    enable_thinking: bool | None = None
    """Passed to the chat template as `enable_thinking` when the explorer renders chat prompts (Qwen3's
    thinking switch); None: the template's default."""

    enable_prompt_truncation: bool = True
    """true: a prompt longer than max_prompt_tokens keeps its last max_prompt_tokens tokens. false
    (Trinity's): the prompt is not cut; it is generated on whole while prompt + 1 token fit max_model_len
    (the response gets what is left), else kept as one masked-out sample per rollout (zero action mask,
    info truncate_status prompt_truncated: counted, trains nothing). Step metrics: rollout/prompt_overlong,
    rollout/prompt_masked."""

    lora_configs: list[LoRAConfig] | None = None
    """LoRA training of the policy through peft (at most one entry; needs `pip install 'trinity-grpc[lora]'`):
    only the adapter trains, explorers receive the merged weights, checkpoints keep the merged model in
    model/ and the adapter in lora_adapter/. Not with trainer.strategy fsdp2."""

    tinker: TinkerConfig = TinkerConfig()
    """Trinity's Tinker backend (training on a remote Tinker service): `enable: true` is refused,
    the trainer here trains the model locally; `enable: false` (or no key) is this project's way."""

    external_model: ExternalModelConfig = ExternalModelConfig()
    """Trinity's remote OpenAI-compatible model for `mode: bench`: with `enable: true` the eval tasksets
    are scored on that API (text and rewards; no token ids, so every other mode refuses it)."""

    @model_validator(mode="before")
    @classmethod
    def _read_chat_template_path(cls, data: Any) -> Any:
        return read_file_key(data, "chat_template_path", "custom_chat_template", "model")

    @model_validator(mode="after")
    def _check_limits(self) -> ModelConfig:
        if self.tinker.enable:
            raise ValueError(
                "model.tinker.enable: true is not supported: Tinker is a remote training service and this "
                "project trains the model locally with torch; remove model.tinker (its LoRA settings: "
                "see model.lora_configs)"
            )
        if self.lora_configs is not None and len(self.lora_configs) > 1:
            raise ValueError(
                f"model.lora_configs has {len(self.lora_configs)} entries; one LoRA adapter is supported "
                "(as in Trinity): keep one entry"
            )
        if self.min_response_tokens >= self.max_response_tokens:
            raise ValueError(
                f"min_response_tokens ({self.min_response_tokens}) must be < max_response_tokens "
                f"({self.max_response_tokens})"
            )
        return self

    @property
    def rollout_defaults(self) -> dict[str, float | int]:
        """The sampling settings given here, which a taskset's rollout_args override."""
        given = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "logprobs": self.logprobs,
        }
        return {key: value for key, value in given.items() if value is not None}

    @property
    def lora(self) -> LoRAConfig | None:
        """The LoRA adapter to train, or None (no lora_configs, or an empty list): full fine-tuning."""
        return self.lora_configs[0] if self.lora_configs else None

    @property
    def effective_max_model_len(self) -> int:
        return self.max_model_len or self.max_prompt_tokens + self.max_response_tokens

    @property
    def effective_critic_path(self) -> str:
        return self.critic_model_path or self.model_path
