"""Trinity v0.5.2 keys given a meaning here: the trainer's (grad_clip, dynamic batch size, Ulysses,
trainer_type), cluster, task_pipeline and monitor_type; and `trinity config check`'s checks beyond
parsing (registry names, files, ports), run on real config files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.cli.config_check import check_file
from services.cli.main import main
from services.common.config import validate_config
from services.common.errors import ConfigError
from services.trainer.batching import token_budget_chunks
from services.trainer.settings import EngineSettings


def test_trainer_grad_clip_is_the_clip_the_engine_uses() -> None:
    cfg = validate_config({"trainer": {"grad_clip": 0.5}})
    assert EngineSettings.from_config(cfg).grad_clip == 0.5
    assert EngineSettings.from_config(validate_config({})).grad_clip == 1.0  # optimizer's default


def test_two_different_grad_clips_are_rejected() -> None:
    with pytest.raises(ConfigError, match="trainer.grad_clip .* same setting"):
        validate_config({"trainer": {"grad_clip": 0.5}, "algorithm": {"optimizer": {"grad_clip": 2.0}}})


def test_ulysses_size_reaches_the_engine_and_scales_the_token_budget() -> None:
    assert EngineSettings.from_config(validate_config({})).ulysses_size == 1
    cfg = validate_config(
        {
            "trainer": {
                "ulysses_sequence_parallel_size": 2,
                "use_dynamic_bsz": True,
                "max_token_len_per_gpu": 64,
            }
        }
    )
    settings = EngineSettings.from_config(cfg)
    # veRL's rule: a micro-batch split over 2 ranks holds 2 x 64 tokens, 64 on each rank
    assert (settings.ulysses_size, settings.tokens_per_micro_batch) == (2, 128)
    # Trinity's default budget: ceil(2 x max_model_len / 2) per rank, so 2 x max_model_len a micro-batch
    filled = validate_config(
        {
            "trainer": {"ulysses_sequence_parallel_size": 2, "use_dynamic_bsz": True},
            "model": {"max_model_len": 101},
        }
    )
    assert filled.trainer.max_token_len_per_gpu == 101
    assert EngineSettings.from_config(filled).tokens_per_micro_batch == 202
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size"):
        validate_config({"trainer": {"ulysses_sequence_parallel_size": 0}})


def test_prompt_truncation_is_on_by_default_and_false_is_accepted() -> None:
    assert validate_config({}).model.enable_prompt_truncation
    cfg = validate_config({"model": {"enable_prompt_truncation": False, "max_prompt_tokens": 64}})
    assert not cfg.model.enable_prompt_truncation  # what it does: tests/unit/explorer/test_model_wrapper.py


def test_enable_preview_is_a_notice_at_trainer_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.trainer.build import build_engine

    base = {"model": {"model_path": "builtin:tiny-arith"}, "checkpoint_root_dir": str(tmp_path)}
    build_engine(validate_config(base))
    assert "no preview UI here" not in "".join(capsys.readouterr())
    build_engine(validate_config({**base, "trainer": {"enable_preview": True}}))
    assert "no preview UI here" in "".join(capsys.readouterr())


def test_dynamic_bsz_sets_the_token_budget() -> None:
    cfg = validate_config({"trainer": {"use_dynamic_bsz": True, "max_token_len_per_gpu": 64}})
    assert EngineSettings.from_config(cfg).tokens_per_micro_batch == 64
    off = validate_config({"trainer": {"use_dynamic_bsz": False, "max_token_len_per_gpu": 64}})
    assert EngineSettings.from_config(off).tokens_per_micro_batch is None
    # unset: Trinity's ceil(2 * max_model_len / ulysses_sequence_parallel_size), decided at load
    filled = validate_config(
        {"trainer": {"use_dynamic_bsz": True}, "model": {"max_prompt_tokens": 100, "max_response_tokens": 50}}
    )
    assert filled.trainer.max_token_len_per_gpu == 2 * 150
    assert EngineSettings.from_config(filled).tokens_per_micro_batch == 300
    from services.cli.resolved import resolved_unset

    assert ("trainer.max_token_len_per_gpu", 300) in resolved_unset(
        {"trainer": {"use_dynamic_bsz": True}}, filled
    )
    given_len = validate_config({"trainer": {"use_dynamic_bsz": True}, "model": {"max_model_len": 4096}})
    assert given_len.trainer.max_token_len_per_gpu == 8192
    assert validate_config({}).trainer.max_token_len_per_gpu is None  # no dynamic batch size, no budget


def test_token_budget_chunks_by_hand() -> None:
    # rows (prompt, response): 0 (2,3) 1 (2,1) 2 (3,4) 3 (1,1) 4 (5,10); sorted by length: 3 1 0 2 4.
    # budget 12: [3] costs 1*2; [3,1] 2*(2+1)=6; +0 would be 3*(2+3)=15 > 12 -> new chunk [0] (5);
    # +2 would be 2*(3+4)=14 > 12 -> [2] (7); row 4 alone is 15 > 12 but still gets its own chunk.
    chunks = token_budget_chunks(torch.tensor([2, 2, 3, 1, 5]), torch.tensor([3, 1, 4, 1, 10]), 12)
    assert [c.tolist() for c in chunks] == [[3, 1], [0], [2], [4]]


def test_verl_trainer_type_and_one_node() -> None:
    from services.cli.prepare import preflight

    assert validate_config({"trainer": {"trainer_type": "verl"}}).trainer.trainer_type == "verl"
    several = validate_config({"cluster": {"node_num": 2}})  # a multi-node trainer (torchrun) is a config
    with pytest.raises(ConfigError, match="cluster.node_num 2: one `trinity run` drives one machine"):
        preflight(several)  # but not one trinity run


def test_task_pipeline_operators_are_rejected() -> None:
    validate_config({"data_processor": {"task_pipeline": {"inputs": []}}})
    with pytest.raises(ConfigError, match="task operators are not implemented"):
        validate_config({"data_processor": {"task_pipeline": {"operators": [{"name": "x"}]}}})


def test_monitor_args_need_a_sink_that_reads_them() -> None:
    with pytest.raises(ConfigError, match="monitor_type tensorboard takes no arguments"):
        validate_config({"monitor": {"monitor_args": {"mode": "offline"}}})


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_check_names_the_unknown_workflow_and_missing_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        f"""
checkpoint_root_dir: {tmp_path}/runs
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
buffer:
  explorer_input:
    taskset:
      name: t
      path: {tmp_path}/nowhere.jsonl
      default_workflow_type: no_such_workflow
      default_reward_fn_type: math_reward
""",
    )
    _cfg, report = check_file(path, [])
    joined = "\n".join(report.problems)
    assert (
        "buffer.explorer_input.taskset.default_workflow_type: unknown workflow 'no_such_workflow'" in joined
    )
    assert f"buffer.explorer_input.taskset.path: {tmp_path}/nowhere.jsonl does not exist" in joined
    assert "default_reward_fn_type" not in joined  # math_reward exists


def test_check_rejects_clashing_ports_and_unknown_algorithm(tmp_path: Path) -> None:
    path = _write(tmp_path, "services: {buffer: {port: 6000}, trainer: {port: 6000}}\n")
    _cfg, report = check_file(path, [])
    assert "services.trainer.port: port 6000 is also services.buffer.port" in "\n".join(report.problems)
    # an unknown algorithm_type is refused when the config loads (the preset is applied there), in every mode
    path = _write(tmp_path, "mode: explore\nalgorithm: {algorithm_type: no_such_algo}\n")
    _cfg, report = check_file(path, [])
    joined = "\n".join(report.problems)
    assert "algorithm.algorithm_type" in joined and "no_such_algo" in joined and "grpo" in joined


def test_check_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\n')
    good = _write(
        tmp_path,
        f"""
checkpoint_root_dir: {tmp_path}/runs
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
trainer: {{trainer_type: verl, grad_clip: 1.0, use_dynamic_bsz: true, max_token_len_per_gpu: 4096,
  ulysses_sequence_parallel_size: 1}}
buffer:
  explorer_input:
    taskset: {{name: t, path: {data}, default_workflow_type: math_workflow}}
""",
    )
    with pytest.raises(SystemExit) as ok:
        main(["config", "check", good])
    assert ok.value.code == 0
    assert ": OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(good).read_text().replace("math_workflow", "nope_workflow"))
    with pytest.raises(SystemExit) as failed:
        main(["config", "check", str(bad)])
    assert failed.value.code == 2
    assert "unknown workflow 'nope_workflow'" in capsys.readouterr().err


def test_replay_buffer_makes_a_priority_queue() -> None:
    from services.buffer.specs import spec_of
    from services.common.config.buffer import StorageConfig

    grouped = StorageConfig(
        name="q",
        storage_type="queue",
        replay_buffer={"enable": True, "reuse_cooldown_time": 5.0, "priority_fn_args": {"decay": 3.0}},
    )
    assert spec_of(grouped).kind == "priority"
    assert grouped.replay.reuse_cooldown_time == 5.0 and grouped.replay.priority_fn_args == {"decay": 3.0}
    flat = StorageConfig(name="q", storage_type="queue", use_priority_queue=True)
    assert spec_of(flat).kind == "priority" and flat.replay.priority_fn == "linear_decay"
    assert spec_of(StorageConfig(name="q", storage_type="queue")).kind == "fifo"
    with pytest.raises(ValueError, match="replay_buffer and use_priority_queue are the same settings"):
        StorageConfig(name="q", use_priority_queue=True, replay_buffer={"enable": True})


def test_data_selector_and_lr_scheduler_type_are_trinity_spellings() -> None:
    cfg = validate_config(
        {
            "buffer": {
                "explorer_input": {"taskset": {"name": "t", "data_selector": {"selector_type": "shuffle"}}}
            },
            "algorithm": {"optimizer": {"lr_scheduler_type": "cosine"}},
            "trainer": {"total_steps": 10},
        }
    )
    taskset = cfg.buffer.explorer_input.taskset
    assert taskset is not None and taskset.selector.selector_type == "shuffle"
    assert EngineSettings.from_config(cfg).warmup_style == "cosine"
    with pytest.raises(ConfigError, match="task_selector and data_selector are the same setting"):
        validate_config(
            {
                "buffer": {
                    "explorer_input": {"taskset": {"name": "t", "data_selector": {}, "task_selector": {}}}
                }
            }
        )
    with pytest.raises(ConfigError, match="lr_scheduler_type and warmup_style are the same setting"):
        validate_config(
            {"algorithm": {"optimizer": {"lr_scheduler_type": "cosine", "warmup_style": "constant"}}}
        )


def test_verl_trainer_config_leaves_map_or_are_rejected() -> None:
    verl = {
        "actor_rollout_ref": {
            "actor": {
                "ppo_micro_batch_size_per_gpu": 2,
                "checkpoint": {"save_contents": ["model"]},
                # the config guide's veRL block: memory knobs of what trainer.logprob_chunk_size does
                "entropy_from_logits_with_chunking": True,
                "entropy_checkpointing": True,
            },
            "ref": {"entropy_from_logits_with_chunking": False},
            "model": {"enable_gradient_checkpointing": True, "use_remove_padding": True},
        },
        "trainer": {"max_actor_ckpt_to_keep": 5, "max_critic_ckpt_to_keep": 5, "balance_batch": False},
        "critic": {"cliprange_value": 0.5, "ulysses_sequence_parallel_size": 1},
    }
    cfg = validate_config({"trainer": {"trainer_type": "verl", "trainer_config": verl}})
    settings = EngineSettings.from_config(cfg)
    assert settings.micro_batch_size == 2 and settings.gradient_checkpointing is True
    assert cfg.trainer.effective_checkpoints_to_keep == 5
    # our own key wins when it agrees, and a disagreement is an error, not a silent choice
    same = validate_config({"trainer": {"micro_batch_size": 2, "trainer_config": verl}})
    assert same.trainer.effective_micro_batch_size == 2
    with pytest.raises(ConfigError, match="trainer.micro_batch_size \\(4\\) and its veRL spelling"):
        validate_config({"trainer": {"micro_batch_size": 4, "trainer_config": verl}})


@pytest.mark.parametrize(
    ("verl", "message"),
    [
        ({"actor_rollout_ref": {"actor": {"strategy": "megatron"}}}, "Megatron is not supported"),
        ({"critic": {"megatron": {"tensor_model_parallel_size": 2}}}, "Megatron is not supported"),
        ({"actor_rollout_ref": {"actor": {"fsdp_config": {"param_offload": True}}}}, "CPU offload"),
        (
            {"algorithm": {"rollout_correction": {"rollout_is": "token"}}},
            "set it under algorithm.rollout_correction",
        ),
        ({"actor_rollout_ref": {"rollout": {"n": 8}}}, "veRL key with no meaning here"),
        ({"critic": {"cliprange_value": 0.2}}, "set algorithm.value_loss_fn_args.cliprange_value"),
    ],
)
def test_verl_leaves_rejected_with_the_reason(verl: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config({"trainer": {"trainer_config": verl}})
    # values that cannot matter are accepted
    validate_config({"trainer": {"trainer_config": {"actor_rollout_ref": {"actor": {"strategy": "fsdp"}}}}})


def test_model_sampling_defaults_under_the_tasksets_own() -> None:
    cfg = validate_config({"model": {"temperature": 0.7, "logprobs": 0}})
    assert cfg.model.rollout_defaults == {"temperature": 0.7, "logprobs": 0}
    assert EngineSettings.from_config(cfg).temperature == 0.7  # the trainer divides logits by it too
    own = validate_config(
        {
            "model": {"temperature": 0.7},
            "buffer": {"explorer_input": {"taskset": {"name": "t", "rollout_args": {"temperature": 0.9}}}},
        }
    )
    assert EngineSettings.from_config(own).temperature == 0.9


def test_schema_type_sft_or_dpo() -> None:
    for schema in ("sft", "dpo"):
        validate_config(
            {"buffer": {"trainer_input": {"auxiliary_buffers": {"d": {"name": "s", "schema_type": schema}}}}}
        )
    with pytest.raises(ConfigError, match="schema_type"):
        validate_config(
            {
                "buffer": {
                    "trainer_input": {"auxiliary_buffers": {"d": {"name": "s", "schema_type": "experience"}}}
                }
            }
        )


def test_check_names_a_reward_argument_the_reward_does_not_take(tmp_path: Path) -> None:
    # a user reward from a plugin directory, without **kwargs (the built-ins take any argument)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "strict.py").write_text(
        "from services.explorer.rewards import REWARD_FUNCTIONS\n"
        "def strict(response, truth=None, prompt=None, scale=1.0):\n"
        "    return {'r': scale * (response == truth)}\n"
        "REWARD_FUNCTIONS.register_module('strict_reward_for_check', strict, force=True)\n"
    )
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\n')
    text = f"""
checkpoint_root_dir: {tmp_path}/runs
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
explorer: {{plugin_dirs: [{plugins}]}}
buffer:
  explorer_input:
    taskset: {{name: t, path: {data}, default_workflow_type: math_workflow,
      default_reward_fn_type: strict_reward_for_check, reward_fn_args: {{scale: 2.0, no_such_arg: 1}}}}
"""
    _cfg, report = check_file(_write(tmp_path, text), [])
    assert report.problems == [
        "buffer.explorer_input.taskset.reward_fn_args: unknown argument(s) ['no_such_arg']; "
        "allowed: ['prompt', 'response', 'scale', 'truth']"
    ]


def test_sync_method_aliases() -> None:
    from services.synchronizer.plan import Plan

    for given, method in (
        ("memory", "nccl"),
        ("online", "nccl"),
        ("offline", "checkpoint"),
        ("nccl", "nccl"),
    ):
        cfg = validate_config({"synchronizer": {"sync_method": given}})
        assert cfg.synchronizer.method == method
        assert Plan.from_config(cfg.synchronizer).method == method
