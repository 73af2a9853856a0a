"""Build the engine from the config: models, algorithm, optimizer — resumed from the latest checkpoint.

Resume rule: when `continue_from_checkpoint` is true and <run_dir>/checkpoints/full holds a complete
checkpoint, the policy weights come from its model/ directory and the optimizer, schedule, critic,
step, RNG and data cursor from its state files; the reference model is always the initial model
(model.model_path), as KL is measured against where training started.

With model.lora_configs the policy is the base model (model.model_path, never the merged weights of a
checkpoint's model/) wrapped in the adapter of the checkpoint's lora_adapter/ on resume, else of
lora.path, else a fresh one (services/trainer/lora.py); the reference is that base: the policy with
its adapter disabled, as Trinity's, so no second copy of the base is loaded.

A reference model is loaded only when the algorithm needs one (a KL penalty or loss with a nonzero
kl_coef, or DPO's loss): Algorithm.use_reference.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

from services.common.config.schema import TrinityConfig
from services.common.errors import FailedPrecondition
from services.common.logging import get_logger
from services.trainer.checkpoint import (
    TrainerState,
    full_checkpoint_root,
    latest_checkpoint,
    load_engine_state,
    load_trainer_state,
    model_dir,
)

log = get_logger("trainer")


@dataclass
class Built:
    engine: Any  # TrainEngine
    tokenizer: Any
    state: TrainerState | None  # None: a fresh start
    resumed_from: str = ""
    dist: Any = None  # DistContext under trainer.strategy fsdp2


def pick_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def train_dtype(cfg: TrinityConfig) -> str:
    """Weights the optimizer updates: float32 unless the user pinned a dtype (bf16 autocast does the rest)."""
    return "float32" if cfg.model.dtype == "auto" else cfg.model.dtype


def load_policy(cfg: TrinityConfig, checkpoint: pathlib.Path | None, *, dtype: str, device: str) -> Any:
    """The policy: a checkpoint's model/ (or model.model_path), or with LoRA the base plus its adapter."""
    from services.models.loading import load_causal_lm
    from services.trainer import lora as peft_lora

    lora = cfg.model.lora
    saved_adapter = checkpoint / peft_lora.ADAPTER_DIR if checkpoint is not None else None
    if lora is None:
        if saved_adapter is not None and saved_adapter.is_dir():
            raise FailedPrecondition(
                f"checkpoint {checkpoint} was trained with model.lora_configs (it holds {peft_lora.ADAPTER_DIR}/); "
                "resume it with the same lora_configs, or start a new run (another name)",
                field="model.lora_configs",
            )
        path = str(model_dir(checkpoint)) if checkpoint is not None else cfg.model.model_path
        return load_causal_lm(path, dtype=dtype, device=device, seed=cfg.model.seed)
    if saved_adapter is not None and not saved_adapter.is_dir():
        raise FailedPrecondition(
            f"checkpoint {checkpoint} was trained without model.lora_configs (no {peft_lora.ADAPTER_DIR}/); "
            "remove lora_configs to resume it, or start a new run (another name) with LoRA",
            field="model.lora_configs",
        )
    base = load_causal_lm(cfg.model.model_path, dtype=dtype, device=device, seed=cfg.model.seed)
    adapter = str(saved_adapter) if saved_adapter is not None else lora.path
    adapter_dtype = dtype if lora.lora_dtype == "auto" else lora.lora_dtype
    log.info("lora", adapter=lora.name, continue_from=adapter, dtype=adapter_dtype)
    return peft_lora.apply_lora(
        base,
        lora,
        dtype=adapter_dtype,
        base_model_name=lora.base_model_name or cfg.model.model_path,
        adapter_path=adapter,
    )


def build_engine(cfg: TrinityConfig, *, device: str | None = None, dist: Any = None) -> Built:
    """Models, algorithm and optimizer; `dist` (a DistContext) shards the policy and critic with FSDP2."""
    import torch
    from transformers.utils import logging as hf_logging

    from services.models.loading import load_causal_lm, load_tokenizer
    from services.trainer.algorithms import build_algorithm
    from services.trainer.engine import TrainEngine
    from services.trainer.modeling import ValueModel
    from services.trainer.settings import EngineSettings

    device = str(dist.device) if dist is not None else device or pick_device()
    if cfg.trainer.trainer_type == "verl":
        log.info("trainer_type verl: training with this project's torch trainer (the only backend here)")
    if cfg.trainer.enable_preview:
        log.info("enable_preview: there is no preview UI here; the rollouts' metrics are in TensorBoard")
    hf_logging.disable_progress_bar()  # checkpoint saves would print tqdm bars into the JSON logs
    algorithm = build_algorithm(cfg.algorithm)
    settings = EngineSettings.from_config(cfg)
    latest = latest_checkpoint(full_checkpoint_root(cfg.run_dir)) if cfg.continue_from_checkpoint else None
    dtype = train_dtype(cfg)
    torch.manual_seed(cfg.model.seed)
    model = load_policy(cfg, latest[1] if latest else None, dtype=dtype, device=device)
    tokenizer = load_tokenizer(cfg.model.model_path, cfg.model.tokenizer_path)
    ref_model = None
    if algorithm.use_reference and cfg.model.lora is None:
        ref_model = load_causal_lm(
            cfg.model.model_path, dtype=cfg.model.dtype, device=device, seed=cfg.model.seed
        )
        ref_model.requires_grad_(False)
    critic = None
    if algorithm.use_critic:
        critic = ValueModel(
            load_causal_lm(cfg.model.effective_critic_path, dtype=dtype, device=device, seed=cfg.model.seed)
        )
    engine = TrainEngine(
        model, algorithm, settings, ref_model=ref_model, critic=critic, device=device, dist=dist
    )
    log.info(
        "trainer_engine_built",
        device=str(engine.device),
        dtype=dtype,
        bf16_autocast=engine.device.type == "cuda" and settings.bf16,
    )
    state = None
    if latest:
        engine.load_state_dict(load_engine_state(latest[1], map_location=device))
        state = load_trainer_state(latest[1])
        log.info("resumed", step=state.step, path=str(latest[1]), samples=state.cursor.samples)
    return Built(engine, tokenizer, state, str(latest[1]) if latest else "", dist)
