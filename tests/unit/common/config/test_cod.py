"""The `cod:` section (Trinity v0.6's research Connect-the-Dots): typed keys, refusals naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.config import validate_config
from services.common.errors import ConfigError


def test_no_section_means_no_packing_and_trinitys_defaults_load() -> None:
    assert validate_config({}).cod is None
    cfg = validate_config(
        {
            "cod": {
                "task_pack_size": 4,
                "eval_task_pack_size": None,
                "packing_strategy": "cod",
                "cod_workflow_args": {},
            }
        }
    )
    assert cfg.cod is not None
    assert cfg.cod.pack_size(is_eval=False) == 4 and cfg.cod.pack_size(is_eval=True) == 4
    assert cfg.cod.cod_workflow_args.activated_cod_methods == ["iterative_hint_e2e"]


def test_the_research_configs_settings_load_typed() -> None:
    cfg = validate_config(
        {
            "cod": {
                "task_pack_size": 4,
                "eval_task_pack_size": 8,
                "packing_strategy": "cod",
                "cod_workflow_args": {
                    "hint_example": False,
                    "activated_cod_methods": ["iterative_hint_e2e"],
                    "reuse_workflow_instance": False,
                    "max_response_tokens_restraint": "8000",  # an ${oc.env:...} default arrives as text
                    "hint_penalty_coef": 0.1,
                    "cod_log_interval": 200,
                    "log_dir": "./logs/research_cod",
                    "exp_name": "p-g-n",
                    "inject_pack_seed": True,
                    "stable_pack_seed": True,
                    "pad_tasks_to_full_pack": True,
                },
            }
        }
    )
    assert cfg.cod is not None
    args = cfg.cod.cod_workflow_args
    assert args.max_response_tokens_restraint == 8000 and args.hint_penalty_coef == 0.1
    assert cfg.cod.pack_size(is_eval=True) == 8 and cfg.cod.pack_size(is_eval=False) == 4


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"task_pack_size": 0}, "cod.task_pack_size"),
        ({"packing_strategy": "random"}, "cod.packing_strategy"),
        ({"cod_workflow_args": {"activated_cod_methods": []}}, "cod.cod_workflow_args.activated_cod_methods"),
        (
            {"cod_workflow_args": {"activated_cod_methods": ["icl"]}},
            "cod.cod_workflow_args.activated_cod_methods",
        ),
        ({"cod_workflow_args": {"hint_penalty_coef": -1}}, "cod.cod_workflow_args.hint_penalty_coef"),
        ({"cod_workflow_args": {"update_context_impl": "mine"}}, "cod.cod_workflow_args.update_context_impl"),
        ({"cod_workflow_args": {"made_up": 1}}, "cod.cod_workflow_args.made_up"),
        ({"cod_workflow_args": {"len_zero_penalty": 10, "len_max_penalty": 5}}, "len_zero_penalty"),
        ({"cod_workflow_args": {"enable_teacher_logprobs": True}}, "enable_teacher_logprobs"),
        ({"cod_workflow_args": {"length_penalty_coef": 0.1}}, "cod.cod_workflow_args.length_penalty_coef"),
        ({"cod_workflow_args": {"task_reward_decay": 0}}, "cod.cod_workflow_args.task_reward_decay"),
    ],
)
def test_bad_values_are_refused_naming_the_key(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        validate_config({"cod": section})


def check(tree: dict[str, Any]) -> list[str]:
    from services.cli.config_check import Report, check_config

    report = Report()
    check_config(validate_config(tree), report)
    return report.problems


def cod_run(workflow: str, **cod_args: Any) -> dict[str, Any]:
    return {
        "mode": "explore",
        "model": {"model_path": "builtin:tiny-arith"},
        "algorithm": {
            "algorithm_type": "multi_step_grpo",
            "advantage_fn": "cod",
            "advantage_fn_args": {"iterative_hint_e2e_causal": True},
        },
        "buffer": {
            "explorer_input": {
                "taskset": {"name": "t", "path": "builtin:arith", "default_workflow_type": workflow}
            }
        },
        "cod": {"task_pack_size": 2, "cod_workflow_args": cod_args},
    }


def test_config_check_names_what_a_cod_run_would_stop_on() -> None:
    assert not [p for p in check(cod_run("cod_frozenlake_obscure_workflow")) if "cod" in p.lower()]
    problems = check(cod_run("math_workflow"))
    assert any(
        p.startswith("buffer.explorer_input.taskset.default_workflow_type") and "not a CoD workflow" in p
        for p in problems
    )
    problems = check(cod_run("cod_grid_navigation_workflow", update_context_impl="update_context_agent"))
    assert any(
        p.startswith("buffer.explorer_input.taskset.workflow_args.update_context_impl") for p in problems
    )
    problems = check(cod_run("cod_grid_navigation_workflow", update_context_impl="pde_update_context"))
    assert not [p for p in problems if "update_context_impl" in p]
    without = cod_run("math_workflow")
    del without["cod"]
    assert any(p.startswith("algorithm.advantage_fn") and "add a cod: section" in p for p in check(without))
