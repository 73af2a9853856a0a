"""`model.lora_configs[]` — LoRA training of the policy through peft (Trinity-RFT's LoRAConfig keys).

The trainer wraps the policy in peft and trains only the adapter; every weight publication and the
checkpoint's model/ directory carry the merged weights W + (lora_alpha / lora_rank)·B·A under the base
model's names, so explorers never know LoRA is on (services/trainer/lora.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from services.common.config.base import Section


class LoRAConfig(Section):
    name: str | None = None
    """A label for the adapter in the trainer's log (Trinity: vLLM's lora_name; here vLLM serves the
    merged weights, so no adapter is named there)."""
    path: str | None = None
    """A peft adapter directory (adapter_config.json + adapter_model.safetensors, e.g. a checkpoint's
    lora_adapter/) to continue training from; its rank, alpha and target modules are the adapter's own.
    None: a fresh adapter (B = 0, so training starts exactly at the base model)."""
    base_model_name: str | None = None
    """The base model recorded in the saved adapter_config.json (peft's base_model_name_or_path);
    None: model.model_path."""
    lora_rank: int = Field(32, ge=1)
    """r, the rank of the update B·A."""
    lora_alpha: int = Field(32, ge=1)
    """The update is scaled by lora_alpha / lora_rank."""
    lora_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """dtype of the adapter weights: auto is the trainer's weight dtype (float32 unless model.dtype
    pins one)."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get an adapter: peft's `all-linear` (every linear / GPT-2 Conv1D layer but the
    output head), a list of module names, or a regex matched against full module names."""
    exclude_modules: str | list[str] | None = None
    """Modules never adapted (names or a regex), as peft's exclude_modules."""
    is_dummy: bool = False
    """Trinity sets this itself for the adapter it creates when no path is given; false (or absent)
    is the only value a config may carry."""

    @model_validator(mode="after")
    def _check(self) -> LoRAConfig:
        if self.is_dummy:
            raise ValueError(
                "model.lora_configs[0].is_dummy: true is internal to Trinity (its stand-in adapter when no "
                "path is given); remove the key: without a path the trainer starts a fresh adapter"
            )
        given = sorted({"target_modules", "exclude_modules"} & self.model_fields_set)
        if self.path is not None and given:
            raise ValueError(
                f"model.lora_configs[0].{given[0]} with a path: the adapter at {self.path} brings its own "
                "target modules (its adapter_config.json); remove the key"
            )
        return self
