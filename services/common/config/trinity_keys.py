"""What Trinity-RFT v0.5.2 keys mean here, where that differs from "the same key, the same meaning".

One table, three uses: the loader appends a key's entry to its "unknown key" error (so a Trinity
user reads why and what to use instead), docs/config.md renders it (scripts/gen_config_docs.py),
and tests/unit/test_trinity_compat.py fails when one of Trinity's example configs uses a key that
is neither in the schema nor here. Keys of the schema with Trinity's name and meaning are not
listed: the generated reference documents them.

Status: `mapped` (accepted, carried to our equivalent), `rejected` (a value or key refused, with
the reason), `not yet` (refused as an unknown key: no meaning here so far; the entry says what
would be needed or what to use; none is left).
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

Status = Literal["mapped", "rejected", "not yet"]


class KeyMeaning(NamedTuple):
    status: Status
    meaning: str


TRINITY_KEYS: dict[str, KeyMeaning] = {
    # trainer: veRL's knobs
    "trainer.trainer_type": KeyMeaning(
        "mapped", "`verl` runs this project's torch trainer (the only backend), with a one-line notice"
    ),
    "trainer.grad_clip": KeyMeaning(
        "mapped", "the gradient-norm clip; the same setting as algorithm.optimizer.grad_clip (give one)"
    ),
    "trainer.use_dynamic_bsz": KeyMeaning(
        "mapped", "micro-batches packed by the token budget max_token_len_per_gpu instead of micro_batch_size"
    ),
    "trainer.max_token_len_per_gpu": KeyMeaning(
        "mapped", "tokens (rows x padded length) per micro-batch with use_dynamic_bsz"
    ),
    "trainer.ulysses_sequence_parallel_size": KeyMeaning(
        "rejected",
        "1 accepted (no sequence parallelism); > 1 rejected: use use_dynamic_bsz, gradient_checkpointing or fsdp2",
    ),
    "trainer.trainer_config": KeyMeaning(
        "mapped",
        "veRL's inline config, leaf by leaf: used for our equivalent key, no effect (a memory or speed knob), "
        "or rejected with the reason; see the veRL table below",
    ),
    "trainer.trainer_config_path": KeyMeaning(
        "mapped", "a veRL config YAML read as trainer.trainer_config (give one of the two)"
    ),
    "trainer.enable_preview": KeyMeaning(
        "mapped",
        "Trinity's rollout preview in its web UI: no UI here; true gets a one-line notice at start-up",
    ),
    # algorithm
    "algorithm.optimizer.lr_scheduler_type": KeyMeaning(
        "mapped", "constant or cosine: the same setting as algorithm.optimizer.warmup_style (give one)"
    ),
    # buffer
    "buffer.*.replay_buffer": KeyMeaning(
        "mapped", "a queue's priority settings (enable, priority_fn, reuse_cooldown_time, priority_fn_args)"
    ),
    "buffer.*.data_selector": KeyMeaning(
        "mapped", "the same setting as task_selector (sequential, shuffle, random, difficulty_based)"
    ),
    "buffer.*.format.image_key": KeyMeaning(
        "rejected",
        "multi-modal rows: refused when set (engines, workflows and trainer are text-only); also video_key",
    ),
    # model
    "model.enable_thinking": KeyMeaning(
        "mapped", "passed to the chat template of the explorer's chat prompts (also per auxiliary model)"
    ),
    "model.enable_prompt_truncation": KeyMeaning(
        "rejected",
        "true accepted, with a difference: Trinity masks out a prompt longer than max_prompt_tokens (no "
        "training on it), here it is truncated from the left and trained on; false rejected: raise max_prompt_tokens",
    ),
    "model.lora_configs": KeyMeaning(
        "mapped",
        "one LoRA adapter trained through peft (the `lora` extra); the explorer gets the merged weights under "
        "the base names by every sync method (Trinity syncs the adapter by checkpoint); strategy fsdp2 refused; "
        "with an adapter path, rollouts before the first sync use the base model",
    ),
    "model.external_model": KeyMeaning(
        "rejected",
        "enable: true refused: bench here runs a local model_path (workflows need token ids and logprobs)",
    ),
    "model.tinker": KeyMeaning(
        "rejected", "enable: true refused: Tinker is a remote training service, this project trains locally"
    ),
    # explorer
    "explorer.rollout_model.use_v1": KeyMeaning(
        "rejected", "true accepted (current vLLM has only its V1 engine); false rejected with that reason"
    ),
    "explorer.auxiliary_models[*].engine_num": KeyMeaning(
        "rejected",
        "1: one engine serves each auxiliary model; its other engine keys default to the rollout model's",
    ),
    "explorer.rollout_model.enforce_eager": KeyMeaning(
        "mapped", "the vLLM engine argument of that name (explorer.rollout_model)"
    ),
    "explorer.rollout_model.enable_prefix_caching": KeyMeaning(
        "mapped", "the vLLM engine argument of that name (explorer.rollout_model)"
    ),
    "explorer.rollout_model.enable_chunked_prefill": KeyMeaning(
        "mapped", "the vLLM engine argument of that name (explorer.rollout_model)"
    ),
    "explorer.rollout_model.gpu_memory_utilization": KeyMeaning(
        "mapped", "the vLLM engine argument of that name (explorer.rollout_model)"
    ),
    "explorer.rollout_model.max_model_len": KeyMeaning(
        "mapped", "the vLLM engine argument of that name (explorer.rollout_model)"
    ),
    "explorer.rollout_model.dtype": KeyMeaning(
        "mapped", "the vLLM engine argument of that name (explorer.rollout_model)"
    ),
    "explorer.rollout_model.engine_type": KeyMeaning(
        "mapped", "vllm and vllm_async: the vLLM engine; transformers: HF generate"
    ),
    # synchronizer, monitor, cluster, data_processor
    "synchronizer.sync_method": KeyMeaning(
        "mapped",
        "Trinity's other names: memory and online are nccl here (memory to memory, no files), offline is checkpoint",
    ),
    "monitor.monitor_type": KeyMeaning(
        "mapped",
        "wandb, mlflow, swanlab: optional packages (an error naming the package when missing); "
        "monitor_args go to the package's run constructor (wandb mode: offline)",
    ),
    "cluster.node_num": KeyMeaning(
        "mapped",
        "the trainer's torchrun nodes (k8s trainer Job); trinity run drives one machine and refuses > 1",
    ),
    "cluster.gpu_per_node": KeyMeaning("mapped", "trinity config check warns when fewer GPUs are visible"),
    "data_processor.task_pipeline": KeyMeaning(
        "rejected", "task operators (Data-Juicer) are not implemented: rejected when operators are given"
    ),
    "service.data_juicer": KeyMeaning(
        "rejected",
        "Trinity's Data-Juicer service: refused when given, Data-Juicer is not integrated here",
    ),
    "data_processor.experience_pipeline.save_input": KeyMeaning(
        "mapped",
        "true (default): each step's experiences before the operators, as JSON lines at input_save_path "
        "(default <run dir>/buffer/pipeline_input.jsonl), when there are operators; database URLs refused",
    ),
}


def meaning_of(key_path: str) -> KeyMeaning | None:
    """The entry for a full key path such as `buffer.trainer_input.auxiliary_buffers.sft.schema_type`,
    `explorer.auxiliary_models[0].seed` or `stages[1].trainer.grad_clip`; None when not listed."""
    path = re.sub(r"^stages\[\d+\]\.", "", key_path)
    path = re.sub(r"\[\d+\]", "[*]", path)
    if path in TRINITY_KEYS:
        return TRINITY_KEYS[path]
    for pattern, entry in TRINITY_KEYS.items():
        if "*" in pattern and re.fullmatch(_glob(pattern), path):
            return entry
    return None


def _glob(pattern: str) -> str:
    # `buffer.*.x`: any depth of sections between; `[*].*`: any key of a list item
    return re.escape(pattern).replace(r"\.\*\.", r"\.(?:.+\.)?").replace(r"\.\*", r"\..+")
