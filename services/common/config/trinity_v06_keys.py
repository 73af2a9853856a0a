"""What the keys Trinity-RFT v0.6 adds mean here (tests/data/trinity_v06_keys.txt lists them beside
v0.5.2's), where the schema alone does not say it; trinity_keys.py merges this table into TRINITY_KEYS.

Keys of v0.6 that are not here and not in the schema are left to another part of issue 33 and stay
unknown keys for now: synchronizer.explorer_sync_interval / trainer_sync_interval,
explorer.max_inflight_batches and explorer.over_rollout.return_partial_tasks (with
synchronizer.sync_style fully_async, a value refused by the schema).
"""

from __future__ import annotations

from services.common.config.key_meaning import KeyMeaning, inert

ENGINES = ("rollout_model", "auxiliary_models[*]")

MEGATRON = (
    "Megatron-Core parallelism, read only with trainer_strategy megatron (refused here: the trainer's "
    "parallelism is trainer.strategy fsdp2); Trinity's default accepted"
)

V06_KEYS: dict[str, KeyMeaning] = {
    # inference engines: the policy's and the auxiliary models'
    **{
        f"explorer.{engine}.{key}": inert(why, accepted)
        for engine in ENGINES
        for key, accepted, why in (
            (
                "data_parallel_size",
                1,
                "vLLM data parallelism inside one engine: 1 only; more engines are engine_num "
                "(one per auxiliary model)",
            ),
            (
                "pipeline_parallel_size",
                1,
                "vLLM pipeline parallelism: 1 only (tensor_parallel_size splits a model)",
            ),
            ("enable_expert_parallel", False, "vLLM expert parallelism for MoE models: false only"),
            (
                "enable_multimodal",
                False,
                "false only: the engines, workflows and trainer here take text (see format.image_key)",
            ),
            (
                "enable_return_routed_experts",
                False,
                "false only: returning a MoE model's routed experts serves router replay "
                "(algorithm.enable_router_replay), which is not implemented here",
            ),
        )
    },
    "explorer.rollout_model.extra_engine_args": KeyMeaning(
        "mapped",
        "passed to vLLM's engine arguments as given (plain values; names we set from our keys refused; "
        "config check checks the names when vLLM is installed); engine_type transformers takes none",
    ),
    "explorer.auxiliary_models[*].extra_engine_args": KeyMeaning(
        "mapped",
        "as explorer.rollout_model.extra_engine_args, for that model's engine (default: the rollout model's)",
    ),
    "explorer.rollout_model.weight_sync_buffer_size": KeyMeaning(
        "mapped",
        "MiB per bucket of the weight broadcast: synchronizer.bucket_mb under Trinity's name (give one)",
    ),
    "explorer.auxiliary_models[*].weight_sync_buffer_size": inert(
        "auxiliary models receive no weight updates (Trinity syncs the rollout model only)"
    ),
    "explorer.rollout_model.api_key": KeyMeaning(
        "mapped",
        "the key the explorer's OpenAI API asks for (Bearer) and its clients send; EMPTY: none (also per auxiliary model)",
    ),
    "explorer.rollout_model.base_port": KeyMeaning(
        "mapped",
        "port of the OpenAI API: runner slot i serves on base_port + i (an auxiliary model's one server on its base_port)",
    ),
    "explorer.rollout_model.enable_thinking": KeyMeaning(
        "mapped",
        "the policy's own enable_thinking for its chat template (engines and OpenAI API); unset: model.enable_thinking",
    ),
    # explorer, synchronizer, algorithm
    "explorer.runner_prepare_concurrency": inert(
        "a cap on concurrent runner set-ups in Trinity (Ray actors racing on glibc's getenv); runners here are "
        "threads of the explorer and start no actors"
    ),
    "explorer.runner_prepare_max_retries": inert(
        "retries of a crashed runner set-up in Trinity (Ray actors); runners here are threads of the explorer "
        "(a failing task is retried max_retry_times)"
    ),
    "explorer.dynamic_timeout.warmup_min_steps": inert("used with dynamic_timeout.enable, refused here"),
    "synchronizer.group_name": inert(
        "the name of Trinity's NCCL weight-sync process group; the synchronizer here forms the group per "
        "sync from its own plan (a name that changes nothing)"
    ),
    "algorithm.enable_router_replay": inert(
        "false only: router replay (the trainer routes a MoE model's tokens to the experts vLLM chose) is "
        "not implemented here",
        False,
    ),
    # trainer
    "trainer.use_remove_padding": inert(
        "veRL's padding-free (varlen) attention: a kernel choice with the same maths"
    ),
    "trainer.balance_batch": inert(
        "veRL's reordering of a batch to balance lengths across data-parallel ranks: the same update"
    ),
    "trainer.critic_warmup": KeyMeaning(
        "mapped", "steps at the start that train only the critic (needs a critic, e.g. ppo)"
    ),
    **{
        f"trainer.{key}": inert(
            "false only: CPU offload is not implemented here; use trainer.gradient_checkpointing, a smaller "
            "max_token_len_per_gpu or strategy fsdp2",
            False,
        )
        for key in ("param_offload", "optimizer_offload", "grad_offload", "offload_policy")
    },
    "trainer.megatron": inert(MEGATRON, {}),
    **{
        f"trainer.megatron.{key}": inert(MEGATRON, default)
        for key, default in (
            ("tensor_model_parallel_size", 1),
            ("pipeline_model_parallel_size", 1),
            ("virtual_pipeline_model_parallel_size", None),
            ("expert_model_parallel_size", 1),
            ("expert_tensor_parallel_size", None),
            ("context_parallel_size", 1),
        )
    },
    "trainer.megatron.sequence_parallel": inert(
        MEGATRON + " (true or false: no effect without tensor parallelism)"
    ),
}
