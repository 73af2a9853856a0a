"""LoRA on the policy through peft (`model.lora_configs`): wrap, merge for publication, save the adapter.

Only the adapter trains (peft freezes the base weights, so the optimizer holds the adapter alone).
Every weight publication and the checkpoint's model/ directory carry the merged weights

    W' = W + (lora_alpha / lora_rank) · B · A        (transposed for GPT-2's Conv1D, whose W is [in, out])

under the base model's own parameter names, computed layer by layer from the live tensors without
touching the trained module (peft's merge_adapter would rewrite W in place): explorers, vLLM and a
later stage's `model_path` see a plain model and never know LoRA is on. The reference model for KL
is the base model: the policy itself with its adapter disabled (`reference_logprobs` in engine.py;
no second copy of the base is loaded), which is Trinity's "adapter disabled". The adapter itself is saved beside model/ as `lora_adapter/` (peft's save_pretrained:
adapter_config.json + adapter_model.safetensors), as Trinity does; a resume loads it from there.

peft is imported only when LoRA is on: `pip install 'trinity-grpc[lora]'`.
"""

from __future__ import annotations

import os
import pathlib
import warnings
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from services.common.config.lora import LoRAConfig
from services.common.errors import FailedPrecondition, InvalidArgument, NotFound

ADAPTER_DIR = "lora_adapter"  # under a checkpoint's global_step_N/
_ADAPTER = "default"  # peft's adapter name: saved at the top of the directory, not in a subfolder
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def require_peft() -> ModuleType:
    try:
        import peft
    except ImportError as exc:
        raise FailedPrecondition(
            "LoRA training needs the peft package: pip install 'trinity-grpc[lora]' (or remove "
            "model.lora_configs)",
            field="model.lora_configs",
        ) from exc
    return peft


def apply_lora(
    model: nn.Module, lora: LoRAConfig, *, dtype: str, base_model_name: str, adapter_path: str | None = None
) -> Any:
    """`model` wrapped in a peft LoRA adapter, only the adapter trainable, adapter weights in `dtype`.

    adapter_path: an adapter to continue from (a checkpoint's lora_adapter/ or lora.path); None
    starts a fresh one from lora's rank, alpha and modules (B = 0: the policy starts at the base).
    base_model_name: recorded in the saved adapter_config.json (base_model_name_or_path).
    """
    peft = require_peft()
    with warnings.catch_warnings():  # peft asks transformers 5 by an old name; nothing for the user to do
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        wrapped = _wrap(peft, model, lora, adapter_path)
    wrapped.peft_config[_ADAPTER].base_model_name_or_path = base_model_name
    for param in wrapped.parameters():
        if param.requires_grad:  # the adapter: peft froze everything else
            param.data = param.data.to(_DTYPES[dtype])
    return wrapped


def _wrap(peft: ModuleType, model: nn.Module, lora: LoRAConfig, adapter_path: str | None) -> Any:
    if adapter_path is None:
        config = peft.LoraConfig(
            task_type=peft.TaskType.CAUSAL_LM,
            r=lora.lora_rank,
            lora_alpha=lora.lora_alpha,
            target_modules=lora.target_modules,
            exclude_modules=lora.exclude_modules,
            bias="none",
            fan_in_fan_out=_has_conv1d(model),  # GPT-2 stores W as [in, out]; peft would warn and fix it
        )
        return peft.get_peft_model(model, config, autocast_adapter_dtype=False)
    config = _adapter_config(peft, adapter_path)
    _check_agrees(config, lora, adapter_path)
    return peft.PeftModel.from_pretrained(
        model, adapter_path, config=config, is_trainable=True, autocast_adapter_dtype=False
    )


def _adapter_config(peft: ModuleType, path: str) -> Any:
    if not (pathlib.Path(path) / "adapter_config.json").is_file():
        raise NotFound(
            f"{path} holds no peft adapter (adapter_config.json); give a directory written by peft's "
            "save_pretrained, such as a checkpoint's lora_adapter/",
            field="model.lora_configs[0].path",
        )
    config = peft.PeftConfig.from_pretrained(path)
    if config.peft_type != peft.PeftType.LORA:
        raise InvalidArgument(
            f"the adapter at {path} is a {config.peft_type} adapter; only LoRA adapters train here",
            field="model.lora_configs[0].path",
        )
    config.task_type = peft.TaskType.CAUSAL_LM  # adapters saved without a task type load as causal LMs
    return config


def _check_agrees(adapter: Any, lora: LoRAConfig, path: str) -> None:
    """The adapter loaded from `path` has the rank and alpha the config gives (when it gives them:
    with lora.path, unset keys mean "whatever the adapter has")."""
    given = (("lora_rank", lora.lora_rank, adapter.r), ("lora_alpha", lora.lora_alpha, adapter.lora_alpha))
    for key, ours, theirs in given:
        if (lora.path is None or key in lora.model_fields_set) and ours != theirs:
            raise InvalidArgument(
                f"model.lora_configs[0].{key} is {ours} but the adapter at {path} has {theirs}; make them "
                "agree (with a path, leaving the key out takes the adapter's; a resumed run keeps its adapter)",
                field=f"model.lora_configs[0].{key}",
            )


def _has_conv1d(model: nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D

    return any(isinstance(module, Conv1D) for module in model.modules())


def is_lora(model: nn.Module) -> bool:
    """True for a peft-wrapped model (without importing peft)."""
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


def hf_model(model: nn.Module) -> Any:
    """The transformers model inside a peft wrapper (its LoRA layers still injected), else `model`."""
    return model.get_base_model() if is_lora(model) else model  # type: ignore[operator]


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The policy's weights with the adapter merged, keyed by the base model's parameter names.

    Each adapted layer's `base_layer.weight` plus peft's get_delta_weight (scale · B·A in W's
    layout); the adapter's own tensors are left out; nothing in `model` changes.
    """
    from peft.tuners.lora import LoraLayer

    base = hf_model(model)
    out: dict[str, Tensor] = {}
    for key, tensor in base.state_dict().items():
        parts = key.split(".")
        if any(part.startswith("lora_") for part in parts):
            continue
        out[".".join(part for part in parts if part != "base_layer")] = tensor.detach()
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        layer: Any = module  # a LoRA Linear / Conv1D / Embedding: get_delta_weight is on the subclasses
        if layer.merged:
            raise FailedPrecondition(f"{name}: the adapter is merged into the weights already")
        weight: Tensor = layer.get_base_layer().weight
        merged = weight.float()
        for adapter in layer.active_adapters:
            merged = merged + layer.get_delta_weight(adapter).float()
        out[f"{name}.weight"] = merged.to(weight.dtype)
    return out


def save_adapter(model: nn.Module, directory: str | os.PathLike[str]) -> None:
    """peft's save_pretrained of the adapter (adapter_config.json + adapter_model.safetensors).

    save_embedding_layers is off: the vocabulary is never resized here, and "auto" would ask the Hub
    whether the base model's config is there.
    """
    wrapped: Any = model
    wrapped.save_pretrained(str(directory), save_embedding_layers=False)
