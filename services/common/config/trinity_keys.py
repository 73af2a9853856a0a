"""What Trinity-RFT keys (v0.5.2's here, v0.6's new ones in trinity_v06_keys.py) mean here, where that differs from "the same key, the same meaning".

One table, three uses: the loader appends a key's entry to its "unknown key" error (so a Trinity
user reads why and what to use instead), docs/config.md renders it (scripts/gen_config_docs.py),
and tests/unit/common/config/test_trinity_compat.py fails when one of Trinity's example configs uses a key that
is neither in the schema nor here. Keys of the schema with Trinity's name and meaning are not
listed: the generated reference documents them.

Status: `mapped` (accepted, carried to our equivalent), `rejected` (a value or key refused, with
the reason), `no effect` (a Trinity-only key: the loader drops it at the values that change nothing
here and refuses any other value with the reason; see strip_inert), `not yet` (refused as an unknown key: no meaning here so far; the entry says what
would be needed or what to use; none is left).
"""

from __future__ import annotations

import re
from typing import Any

from services.common.config.key_meaning import ANY, KeyMeaning, Status, inert
from services.common.config.trinity_v06_keys import V06_KEYS

__all__ = ["ANY", "TRINITY_KEYS", "KeyMeaning", "Status", "inert", "meaning_of", "strip_inert"]

TRINITY_KEYS: dict[str, KeyMeaning] = {
    # trainer: veRL's knobs
    "trainer.trainer_type": KeyMeaning(
        "mapped",
        "`verl` runs this project's torch trainer (the only backend), with a one-line notice; tinker "
        "(Trinity's remote Tinker trainer) is refused, see model.tinker",
    ),
    "trainer.grad_clip": KeyMeaning(
        "mapped", "the gradient-norm clip; the same setting as algorithm.optimizer.grad_clip (give one)"
    ),
    "trainer.use_dynamic_bsz": KeyMeaning(
        "mapped", "micro-batches packed by the token budget max_token_len_per_gpu instead of micro_batch_size"
    ),
    "trainer.max_token_len_per_gpu": KeyMeaning(
        "mapped",
        "tokens (rows x padded length) per micro-batch with use_dynamic_bsz; unset: 2 x max_model_len / "
        "ulysses_sequence_parallel_size, Trinity's rule, resolved at load",
    ),
    "trainer.ulysses_sequence_parallel_size": KeyMeaning(
        "mapped",
        "Ulysses sequence parallelism of the fsdp2 trainer: each sequence split over N torchrun ranks, "
        "all-to-all around attention (Llama, Qwen2, Qwen3, GPT-2); needs strategy fsdp2 on a multiple "
        "of N ranks, checked when the trainer starts; docs/sequence_parallel.md",
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
    "algorithm.bypass_old_logprobs": KeyMeaning(
        "mapped",
        "Trinity v0.6 (default true): the engine's logprobs are the behaviour policy; false: the trainer "
        "recomputes old logprobs before each update (veRL's decoupled mode). Trinity v0.5.2 spelled it "
        "trainer.trainer_config.algorithm.rollout_correction.bypass_mode (accepted there too)",
    ),
    "algorithm.rollout_correction": KeyMeaning(
        "mapped",
        "Trinity v0.6: veRL's RolloutCorrectionConfig as a typed section (rollout_is, rollout_is_threshold, "
        "rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold, bypass_mode, loss_type); applied "
        "by the trainer, metrics rollout_corr/* per step",
    ),
    "algorithm.optimizer.lr_scheduler_type": KeyMeaning(
        "mapped", "constant or cosine: the same setting as algorithm.optimizer.warmup_style (give one)"
    ),
    # explorer: Trinity's serve mode (docs/serve.md)
    "explorer.listen_address": KeyMeaning(
        "mapped", "the serve-mode proxy's bind address; default 127.0.0.1 here (Trinity: 0.0.0.0)"
    ),
    "explorer.db_url": KeyMeaning(
        "mapped",
        "the serve-mode proxy's history: sqlite URLs only; default sqlite:///<run dir>/serve/proxy_history.db",
    ),
    "explorer.service_status_check_interval": KeyMeaning(
        "mapped",
        "seconds between the serve-mode proxy's asks for a newer version; each ask is an explorer step of "
        "the sync plan (sync_style dynamic_by_trainer or fully_async, sync_method checkpoint)",
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
        "multi-modal rows: refused when set (the engines and the trainer are text-only; simple_mm_workflow "
        "exists and refuses image rows); also video_key",
    ),
    # model
    "model.enable_thinking": KeyMeaning(
        "mapped",
        "passed to the chat template as enable_thinking wherever a chat is rendered: the explorer's engines and "
        "OpenAI API (unless explorer.rollout_model / auxiliary_models[] give their own) and the trainer's "
        "messages rows of SFT/DPO datasets (unless the buffer's format.enable_thinking is given)",
    ),
    "model.enable_prompt_truncation": KeyMeaning(
        "mapped",
        "true, with a difference: Trinity masks out a prompt longer than max_prompt_tokens (no training on "
        "it), here it is truncated from the left and trained on; false as Trinity: the prompt is kept whole "
        "(the response gets what max_model_len leaves), and one that leaves no room becomes a masked-out "
        "sample (zero action mask, counted in rollout/prompt_masked)",
    ),
    "model.lora_configs": KeyMeaning(
        "mapped",
        "one LoRA adapter trained through peft (the `lora` extra); the explorer gets the merged weights under "
        "the base names by every sync method (Trinity syncs the adapter by checkpoint); strategy fsdp2 refused; "
        "with an adapter path, rollouts before the first sync use the base model",
    ),
    "model.external_model": KeyMeaning(
        "mapped",
        "mode bench: the eval tasksets are scored on the remote OpenAI-compatible API (base URL and key from "
        "the environment variables base_url_env / api_key_env, as model_name); chat-only replies, so every "
        "other mode refuses enable: true",
    ),
    "model.tinker": KeyMeaning(
        "rejected",
        "enable: true refused: Tinker is a remote training service, this project trains locally; its other "
        "keys are Trinity's TinkerConfig (checked; unknown ones refused)",
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
        "mapped",
        "vllm and vllm_async: the vLLM engine; transformers: HF generate; Trinity's tinker (a remote Tinker "
        "sampler) and external (a remote OpenAI API) are refused: workflows here need a local engine's token "
        "ids and logprobs",
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


TRINITY_KEYS.update(
    {
        # top level, cluster
        "ignore_validator_suggestions": inert(
            "Trinity's GPU-memory validator's suggestions; there is no such validator here"
        ),
        "cluster.ray_address": inert(
            "there is no Ray here: each service's address is services.<name>.host / port", "auto"
        ),
        # model
        "model.trust_remote_code": inert(
            "models load without remote code here (true refused: use a model transformers supports)", False
        ),
        "model.repetition_penalty": inert("1.0 only: the samplers here have no repetition penalty", 1.0, 1),
        "model.rope_scaling": inert(
            "RoPE overrides are not applied here: edit the model's config.json", None
        ),
        "model.rope_theta": inert("RoPE overrides are not applied here: edit the model's config.json", None),
        "model.fully_sharded_loras": inert(
            "vLLM LoRA serving (vLLM gets merged weights here; unread in Trinity too)"
        ),
        "model.max_cpu_loras": inert(
            "vLLM LoRA serving (vLLM gets merged weights here; unread in Trinity too)"
        ),
        # algorithm, trainer, monitor, synchronizer
        "algorithm.optimizer.optimizer_type": inert(
            "AdamW is the optimizer here (adam/adamw accepted)", "adam", "adamw"
        ),
        "algorithm.optimizer.clip_grad": inert(
            "the Megatron optimizer's clip (no Megatron here); the clip is trainer.grad_clip"
        ),
        "trainer.trainer_strategy": inert(
            "fsdp/fsdp2 accepted: the parallelism here is trainer.strategy (single or fsdp2); megatron refused",
            "fsdp",
            "fsdp2",
        ),
        "trainer.save_hf_checkpoint": inert(
            "every full checkpoint holds the model in HF format here (model/): always and last accepted, never refused",
            "always",
            "last",
        ),
        "trainer.fix_actor_microbatch_loss_scale": inert(
            "micro-batch losses are always scaled to the exact batch loss here (what true fixes in veRL)"
        ),
        "monitor.detailed_stats": inert(
            "false only: eval metrics here are mean@k / best@k per taskset (see docs/algorithms.md)", False
        ),
        "synchronizer.wait_for_checkpoint": inert("unread in Trinity v0.5.2 too"),
        # explorer: Trinity's serve mode and scheduling knobs
        "explorer.runner_num": inert("deprecated in Trinity (a warning only); runners are runner_per_model"),
        "explorer.concurrent_mode": inert(
            "how a runner runs a task's repeats (Trinity's sequential, asynchronous or multi-threading): here "
            "they are one request of n samples, the same rollouts in each of Trinity's modes",
            "sequential",
            "asynchronous",
            "multi-threading",
        ),
        "explorer.runner_state_report_interval": inert(
            "runner state: `trinity status` shows it on demand here"
        ),
        "explorer.over_rollout.ratio": inert("0 only: every step waits for all its tasks here", 0, 0.0),
        "explorer.over_rollout.wait_after_min": inert("used with over_rollout.ratio > 0, refused here"),
        "explorer.over_rollout": inert("see over_rollout.ratio", {}),
        "explorer.over_rollout.return_partial_tasks": inert(
            "Trinity v0.6; false only: with over_rollout.ratio 0 no task is cut short, so none is partial",
            False,
        ),
        "explorer.max_inflight_batches": inert(
            "Trinity v0.6 (fully_async); 1 only: an explorer runs one step at a time (a restarted one "
            "replays only its last batch); run more explorers for more batches in flight",
            1,
        ),
        "explorer.dynamic_timeout.enable": inert("false only: the timeout is explorer.max_timeout", False),
        "explorer.dynamic_timeout.ratio": inert("used with dynamic_timeout.enable, refused here"),
        "explorer.dynamic_timeout": inert("see dynamic_timeout.enable", {}),
        # per-engine overrides of model.* (Trinity copies model.* into them when unset)
        **{
            f"explorer.{engine}.{key}": inert(
                f"unset only: the engines here use model.{key} (set it there)", None
            )
            for engine in ("rollout_model", "auxiliary_models[*]")
            for key in (
                "min_response_tokens",
                "enable_prompt_truncation",
                "repetition_penalty",
                "chat_template",
            )
        },
        **{
            f"explorer.rollout_model.{key}": inert(
                f"unset only: the rollout engines use model.{key} (set it there)", None
            )
            for key in ("max_prompt_tokens", "max_response_tokens")
        },
        "explorer.rollout_model.name": inert("a label: the rollout model is named by model.model_path here"),
        "explorer.auxiliary_models[*].name": inert("a label: auxiliary models are named by model_path here"),
        "explorer.rollout_model.trust_remote_code": inert("models load without remote code here", False),
        "explorer.auxiliary_models[*].trust_remote_code": inert(
            "models load without remote code here", False
        ),
        "explorer.rollout_model.ignore_eos": inert("false only (a vLLM testing knob)", False),
        "explorer.auxiliary_models[*].ignore_eos": inert("false only (a vLLM testing knob)", False),
        "explorer.auxiliary_models[*].use_v1": inert("current vLLM has only its V1 engine", True),
        "explorer.auxiliary_models[*].enable_chunked_prefill": inert(
            "a scheduling choice of vLLM that changes no output; the rollout model's setting is used"
        ),
        "explorer.auxiliary_models[*].gpu_memory_utilization": inert(
            "GPU memory: the rollout model's gpu_memory_utilization is used (0.9 accepted)", 0.9
        ),
        "explorer.auxiliary_models[*].enable_log_requests": inert(
            "the rollout model's enable_log_requests is used (false accepted)", False
        ),
        "explorer.auxiliary_models[*].enable_auto_tool_choice": inert(
            "the auxiliary model's OpenAI API uses the rollout model's parsers (false accepted)", False
        ),
        "explorer.auxiliary_models[*].tool_call_parser": inert(
            "the auxiliary model's OpenAI API uses the rollout model's parsers", None
        ),
        "explorer.auxiliary_models[*].reasoning_parser": inert(
            "the auxiliary model's OpenAI API uses the rollout model's parsers", None
        ),
        "explorer.auxiliary_models[*].external_model_config.enable": inert(
            "a remote model is not supported (see model.external_model)", False
        ),
        **{
            f"explorer.auxiliary_models[*].external_model_config.{key}": inert(
                "used only with external_model_config.enable, refused here"
            )
            for key in ("model_name", "base_url_env", "api_key_env")
        },
        "explorer.auxiliary_models[*].external_model_config": inert("see external_model_config.enable", {}),
        # buffer
        "buffer.*.max_retry_times": inert(
            "SQL session retries: the buffer service owns its SQLite files here; clients retry on their own"
        ),
        "buffer.*.max_retry_interval": inert(
            "SQL session retries: the buffer service owns its SQLite files here; clients retry on their own"
        ),
        "buffer.*.format.workflow_key": inert("empty only: one workflow per taskset here", ""),
        "buffer.*.format.reward_fn_key": inert("empty only: one reward fn per taskset here", ""),
        # data_processor, stages
        "data_processor.task_pipeline.*": KeyMeaning(
            "rejected", "task operators (Data-Juicer) are not implemented: prepare the task file beforehand"
        ),
    }
)


TRINITY_KEYS.update(V06_KEYS)


def strip_inert(raw: Any, prefix: str = "", refused: list[tuple[str, str]] | None = None) -> Any:
    """`raw` without the `no effect` keys at values that change nothing here (children first, so a
    section left empty can go too). Any other value of such a key raises ValueError with its meaning;
    with `refused` given, it is recorded there as (key path, message) and taken out instead."""
    if isinstance(raw, list):
        return [strip_inert(item, f"{prefix}[{i}]", refused) for i, item in enumerate(raw)]
    if not isinstance(raw, dict):
        return raw
    out = {}
    for key, value in raw.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        value = strip_inert(value, path, refused)
        entry = meaning_of(path)
        if entry is not None and entry.accepts:
            if entry.accepts is ANY or value in entry.accepts:
                continue
            message = f"{path} {value!r}: {entry.meaning}"
            if refused is None:
                raise ValueError(message)
            refused.append((path, message))
            continue
        out[key] = value
    return out


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
