"""Trinity v0.5.2 explorer keys given a meaning here: auxiliary models' engine keys, enable_thinking,
max_repeat_times_per_runner, default_eval_workflow_type and rollout_model.use_v1."""

from __future__ import annotations

import pathlib

import pytest
import torch

from services.common.config import validate_config
from services.common.errors import ConfigError


def test_auxiliary_model_keys_default_to_the_rollout_models() -> None:
    cfg = validate_config(
        {
            "explorer": {
                "rollout_model": {"engine_type": "vllm", "tensor_parallel_size": 1, "seed": 7},
                "auxiliary_models": [
                    {
                        "model_path": "judge",
                        "tensor_parallel_size": 2,
                        "max_model_len": 4096,
                        "enable_thinking": False,
                    }
                ],
            }
        }
    )
    aux = cfg.explorer.auxiliary_models[0]
    engine = aux.engine_config(cfg.explorer.rollout_model)
    assert (engine.engine_type, engine.tensor_parallel_size, engine.max_model_len, engine.seed) == (
        "vllm",
        2,
        4096,
        7,
    )
    assert cfg.explorer.rollout_model.tensor_parallel_size == 1  # the policy's own settings are untouched
    with pytest.raises(ConfigError, match="one engine serves each auxiliary model"):
        validate_config({"explorer": {"auxiliary_models": [{"model_path": "judge", "engine_num": 2}]}})


def test_enable_thinking_reaches_the_chat_template() -> None:
    from services.explorer.model_wrapper import ModelWrapper
    from services.models.loading import load_tokenizer

    tokenizer = load_tokenizer("builtin:tiny-arith")
    template = "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}{{ messages[0]['content'] }}"
    messages = [{"role": "user", "content": "1+1="}]

    def render(thinking: bool | None) -> str:
        wrapper = ModelWrapper(None, tokenizer, chat_template=template, enable_thinking=thinking)  # type: ignore[arg-type]
        return wrapper.render_chat(messages)

    assert render(False) == "/no_think 1+1="
    assert render(True) == "1+1=" and render(None) == "1+1="


class _Sampler:
    """A workflow that samples every repeat in one run (can_repeat), recording the n it was asked for."""

    can_repeat = True
    is_async = False
    asked: list[int] = []

    def __init__(self, *, task: object, model: object, auxiliary_models: object = None) -> None:
        self.task = task

    def resettable(self) -> bool:
        return False

    def run(self) -> list[object]:
        from services.explorer.workflows import Experience

        n = self.task.rollout_args.n  # type: ignore[attr-defined]
        _Sampler.asked.append(n)
        return [Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=1, reward=0.0) for _ in range(n)]


async def test_max_repeat_times_per_runner_splits_repeats_and_keeps_run_ids() -> None:
    from services.explorer.runner import VersionRef, WorkflowRunner
    from services.explorer.workflows import Task

    cfg = validate_config({"explorer": {"max_repeat_times_per_runner": 3}})
    runner = WorkflowRunner(
        lambda i: object(),
        slots=4,
        max_timeout=10,
        max_retry_times=0,
        version_fn=VersionRef(0),
        max_repeat_times_per_runner=cfg.explorer.max_repeat_times_per_runner,
    )
    _Sampler.asked.clear()
    task = Task(workflow=_Sampler, raw_task={}, task_id="t", repeat_times=8, taskset="ts")
    results = await runner.run_tasks([task])
    # 8 repeats, at most 3 a runner: chunks of 3, 3, 2 on three runners; run ids 0..7 as if unsplit
    assert sorted(_Sampler.asked) == [2, 3, 3]
    assert [exp.run_id for r in results for exp in r.experiences] == list(range(8))
    assert {r.task.task_id for r in results} == {"t"}


async def test_default_eval_workflow_type_is_the_workflow_of_eval_tasksets_that_name_none(
    tmp_path: pathlib.Path,
) -> None:
    """Through a real buffer core and the explorer's resolver: the buffer decides, the wire carries it."""
    from services.buffer.core import BufferCore
    from services.buffer.specs import defaults_from_config, specs_from_config
    from services.explorer.explorer import TaskResolver

    data = tmp_path / "tasks.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    cfg = validate_config(
        {
            "checkpoint_root_dir": str(tmp_path / "runs"),
            "buffer": {
                "explorer_input": {
                    "taskset": {"name": "train", "path": str(data)},
                    "eval_tasksets": [
                        {"name": "plain", "path": str(data)},
                        {"name": "own", "path": str(data), "default_workflow_type": "arith_workflow"},
                    ],
                    "default_workflow_type": "math_workflow",
                    "default_eval_workflow_type": "math_boxed_workflow",
                    "default_reward_fn_type": "math_reward",
                }
            },
        }
    )
    core = BufferCore(str(tmp_path / "buffer"), defaults_from_config(cfg))
    await core.start(specs_from_config(cfg))
    resolve = TaskResolver()
    names = {}
    for name in ("train", "plain", "own"):
        wire = (await core.read_tasks(name, 1)).tasks[0]
        names[name] = resolve(wire, 0).workflow.__name__
    await core.close()
    assert names == {"train": "MathWorkflow", "plain": "MathBoxedWorkflow", "own": "ArithWorkflow"}


def test_use_v1_false_is_refused_with_the_reason() -> None:
    assert validate_config({"explorer": {"rollout_model": {"use_v1": True}}}).explorer.rollout_model.use_v1
    with pytest.raises(ConfigError, match="V0 engine, which current vLLM no longer has"):
        validate_config({"explorer": {"rollout_model": {"use_v1": False}}})
