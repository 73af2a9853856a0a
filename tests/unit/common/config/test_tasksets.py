"""A taskset's effective settings: each precedence rule of services/common/config/tasksets.py by hand,
the refusal of a training repeat_times that disagrees with the algorithm's, and what
`trinity config check` shows of the values a file left unset."""

from __future__ import annotations

import pathlib

import pytest

from services.cli.resolved import resolved_report, resolved_unset
from services.common.config import load_config, validate_config
from services.common.config.buffer import StorageConfig
from services.common.config.tasksets import TasksetDefaults, effective_taskset, task_settings
from services.common.errors import ConfigError

DEFAULTS = TasksetDefaults(
    workflow="wf_default",
    eval_workflow="wf_eval",
    reward_fn="rw_default",
    repeat_times=4,
    rollout_args={"temperature": 0.7, "top_p": 0.9},
    total_epochs=3,
    total_steps=None,
)


def test_training_taskset_takes_every_default() -> None:
    st = effective_taskset(StorageConfig(name="t"), DEFAULTS, is_eval=False)
    assert (st.default_workflow_type, st.default_reward_fn_type) == ("wf_default", "rw_default")
    assert (st.repeat_times, st.total_epochs, st.total_steps) == (4, 3, None)
    assert st.rollout_args == {"temperature": 0.7, "top_p": 0.9}


def test_eval_taskset_defaults_to_the_eval_workflow_one_sample_one_epoch() -> None:
    st = effective_taskset(StorageConfig(name="e"), DEFAULTS, is_eval=True)
    assert (st.default_workflow_type, st.default_reward_fn_type) == ("wf_eval", "rw_default")
    assert (st.repeat_times, st.total_epochs) == (1, 1)
    no_eval_default = TasksetDefaults(workflow="wf_default")
    assert (
        effective_taskset(StorageConfig(), no_eval_default, is_eval=True).default_workflow_type
        == "wf_default"
    )


def test_a_tasksets_own_values_win() -> None:
    own = StorageConfig(
        default_workflow_type="wf_own",
        default_reward_fn_type="rw_own",
        repeat_times=2,
        total_epochs=5,
        rollout_args={"temperature": 0.0},
    )
    for is_eval in (False, True):
        st = effective_taskset(own, DEFAULTS, is_eval=is_eval)
        assert (st.default_workflow_type, st.default_reward_fn_type) == ("wf_own", "rw_own")
        assert (st.repeat_times, st.total_epochs) == (2, 5)
        assert st.rollout_args == {"temperature": 0.0, "top_p": 0.9}  # key by key over the model's


def test_resolution_is_idempotent_and_leaves_the_section_untouched() -> None:
    section = StorageConfig(name="t")
    once = effective_taskset(section, DEFAULTS, is_eval=False)
    assert effective_taskset(once, TasksetDefaults(), is_eval=False) == once
    assert section.default_workflow_type is None and section.rollout_args == {}


def test_task_settings_carry_reward_fn_args_inside_workflow_args() -> None:
    st = StorageConfig(default_workflow_type="w", workflow_args={"a": 1}, reward_fn_args={"k": 2})
    settings = task_settings(st)
    assert settings["workflow_args"] == {"a": 1, "reward_fn_args": {"k": 2}}
    assert (settings["workflow"], settings["reward_fn"], settings["repeat_times"]) == ("w", "", 1)


def _cfg(**buffer: object) -> dict:
    return {"algorithm": {"algorithm_type": "grpo"}, "buffer": {"batch_size": 3, **buffer}}


def test_loader_resolves_grpo_repeat_times_for_every_reader() -> None:
    cfg = validate_config(_cfg(explorer_input={"taskset": {"name": "t", "path": "x.jsonl"}}))
    assert cfg.algorithm.repeat_times == 2  # Trinity's grpo preset, not the field's 1
    assert cfg.buffer.explorer_input.taskset is not None
    assert cfg.buffer.explorer_input.taskset.repeat_times == 2
    assert cfg.train_batch_size == 6


def test_explorer_input_defaults_beat_the_older_buffer_level_keys() -> None:
    cfg = validate_config(
        _cfg(
            default_workflow_type="old_wf",
            default_reward_fn_type="old_rw",
            explorer_input={
                "taskset": {"name": "t", "path": "x.jsonl"},
                "default_workflow_type": "new_wf",
                "default_reward_fn_type": "new_rw",
            },
        )
    )
    taskset = cfg.buffer.explorer_input.taskset
    assert taskset is not None
    assert (taskset.default_workflow_type, taskset.default_reward_fn_type) == ("new_wf", "new_rw")
    only_old = validate_config(
        _cfg(default_workflow_type="old_wf", explorer_input={"taskset": {"name": "t", "path": "x"}})
    )
    assert only_old.buffer.explorer_input.taskset.default_workflow_type == "old_wf"  # type: ignore[union-attr]


def test_training_repeat_times_that_disagrees_with_the_algorithm_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"taskset.repeat_times \(4\) differs from algorithm.repeat_times \(2"
    ):
        validate_config(_cfg(explorer_input={"taskset": {"name": "t", "path": "x", "repeat_times": 4}}))
    agreed = {"taskset": {"name": "t", "path": "x", "repeat_times": 2}}
    assert validate_config(_cfg(explorer_input=agreed)).train_batch_size == 6


def test_config_check_lists_the_values_the_file_left_unset(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "algorithm: {algorithm_type: grpo, kl_loss_fn: none}\n"
        "model: {temperature: 0.5}\n"
        "buffer:\n  batch_size: 2\n  explorer_input:\n"
        "    default_eval_workflow_type: math_boxed_workflow\n"
        "    taskset: {name: t, path: x, default_workflow_type: math_workflow}\n"
        "    eval_tasksets: [{name: e, path: x}]\n"
    )
    cfg = load_config(str(path))
    lines = resolved_report(str(path), [], cfg)
    assert lines[0] == "resolved at load (not set in the file):"
    assert "  algorithm.repeat_times: 2" in lines and "  buffer.train_batch_size: 4" in lines
    assert "  buffer.explorer_input.eval_tasksets[0].default_workflow_type: math_boxed_workflow" in lines
    assert "  buffer.explorer_input.taskset.rollout_args.temperature: 0.5" in lines
    given = dict(resolved_unset({"algorithm": {"algorithm_type": "grpo", "kl_loss_fn": "none"}}, cfg))
    assert "algorithm.kl_loss_fn" not in given and "algorithm.advantage_fn" in given  # set in the file / not
    assert "buffer.explorer_input.taskset.default_workflow_type" not in dict(
        resolved_unset({"buffer": {"explorer_input": {"taskset": {"default_workflow_type": "w"}}}}, cfg)
    )


# ---- several training tasksets (buffer.explorer_input.tasksets) ------------------------------


def _mixed(*sets: dict, **buffer: object) -> dict:
    return _cfg(explorer_input={"default_workflow_type": "math_workflow", "tasksets": list(sets)}, **buffer)


def test_tasksets_take_the_training_defaults_and_trinitys_names() -> None:
    cfg = validate_config(
        _mixed(
            {"path": "a.jsonl", "rollout_args": {"temperature": 1.0}},
            {
                "name": "alchemy",
                "path": "b.jsonl",
                "default_workflow_type": "countdown",
                "rollout_args": {"temperature": 1.0},
            },
            total_epochs=3,
        )
    )
    inputs = cfg.buffer.explorer_input
    first, second = inputs.tasksets
    assert (first.name, first.default_workflow_type, first.repeat_times, first.total_epochs) == (
        "taskset_0",  # Trinity's name of an unnamed training taskset
        "math_workflow",
        2,
        3,
    )
    assert (second.name, second.default_workflow_type) == ("alchemy", "countdown")
    assert inputs.training_reader == "tasksets" and inputs.taskset is None
    assert [key for key, _ in inputs.training_tasksets()] == [
        "buffer.explorer_input.tasksets[0]",
        "buffer.explorer_input.tasksets[1]",
    ]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            _cfg(explorer_input={"taskset": {"path": "a"}, "tasksets": [{"path": "b"}]}),
            r"buffer.explorer_input.tasksets: taskset and tasksets are both set",
        ),
        (_mixed({"path": "a"}, {"storage_type": "queue"}), r"tasksets\[1\].storage_type: 'queue'"),
        (
            _mixed({"name": "x", "path": "a"}, {"name": "x", "path": "b"}),
            r"tasksets\[1\].name: 'x' names two",
        ),
        (_mixed({"name": "tasksets", "path": "a"}), r"no taskset may be named 'tasksets'"),
        (
            _mixed({"path": "a", "total_epochs": 2}),
            r"tasksets\[0\].total_epochs: 2; the mixed tasksets run buffer",
        ),
        (_mixed({"path": "a"}, {"path": "b", "total_steps": 9}), r"tasksets\[1\].total_steps: 9"),
        (
            _mixed({"path": "a"}, {"path": "b", "repeat_times": 4}),
            r"tasksets\[1\].repeat_times \(4\) differs",
        ),
        (
            _mixed({"path": "a"}, {"path": "b", "rollout_args": {"temperature": 0.6}}),
            r"tasksets\[1\].rollout_args.temperature \(0.6\) differs from tasksets\[0\]'s \(1.0\)",
        ),
    ],
)
def test_tasksets_refusals_name_the_key(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        validate_config(raw)
    assert err.value.field.startswith("buffer.explorer_input")


def test_a_tasksets_own_epochs_equal_to_the_buffers_are_accepted() -> None:
    cfg = validate_config(_mixed({"path": "a", "total_epochs": 2, "repeat_times": 2}, total_epochs=2))
    assert cfg.buffer.explorer_input.tasksets[0].total_epochs == 2


def test_config_check_shows_the_resolved_names_of_tasksets(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "algorithm: {algorithm_type: grpo}\n"
        "buffer:\n  batch_size: 2\n  explorer_input:\n"
        "    tasksets: [{path: a, default_workflow_type: math_workflow}, {name: b, path: b, default_workflow_type: countdown}]\n"
    )
    lines = resolved_report(str(path), [], load_config(str(path)))
    assert "  buffer.explorer_input.tasksets[0].name: taskset_0" in lines
    assert "  buffer.explorer_input.tasksets[1].repeat_times: 2" in lines
    assert not any(line.startswith("  buffer.explorer_input.tasksets[1].name") for line in lines)
