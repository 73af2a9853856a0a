"""The explorer's step loop on a real tiny model with fake buffer / synchronizer clients."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from services.common.config.schema import TrinityConfig
from services.common.errors import AlreadyExists
from services.common.experience import Experience
from services.explorer.build import build_pool, build_runner
from services.explorer.engines.transformers_engine import sequence_logprobs
from services.explorer.explorer import Explorer
from services.explorer.runner import VersionRef
from services.models.loading import load_tokenizer
from services.tasks.arith import ArithSpec, generate
from tests.fakes.explorer import FakeBuffer, FakeWeightSync, RecordingMonitor


def make_cfg(**explorer) -> TrinityConfig:
    return TrinityConfig.model_validate(
        {
            "algorithm": {"repeat_times": 4},
            "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 32, "max_response_tokens": 6},
            "buffer": {
                "batch_size": 3,
                "explorer_input": {
                    "taskset": {
                        "name": "arith",
                        "default_workflow_type": "arith_workflow",
                        "format": {"prompt_key": "question", "response_key": "answer"},
                    },
                    "eval_tasksets": [
                        {
                            "name": "eval_arith",
                            "default_workflow_type": "arith_workflow",
                            "repeat_times": 2,
                            "format": {"prompt_key": "question", "response_key": "answer"},
                            "rollout_args": {"temperature": 1.0},
                        }
                    ],
                },
            },
            "explorer": {
                "runner_per_model": 4,
                "max_timeout": 20,
                "max_retry_times": 1,
                "eval_interval": 2,
                **explorer,
            },
            "monitor": {"monitor_type": "none"},
        }
    )


@pytest.fixture
def parts():
    built = []

    def make(cfg, buffer, plan=None):
        buffer.cfg = buffer.cfg or cfg  # tasks carry their taskset's settings, as from the real buffer
        tok = load_tokenizer(cfg.model.model_path)
        pool = build_pool(cfg, tok)
        runner = build_runner(cfg, pool, tok, VersionRef(), [])
        monitor = RecordingMonitor()
        weights = FakeWeightSync(pool, plan)
        explorer = Explorer(cfg, buffer=buffer, weights=weights, runner=runner, monitor=monitor)
        built.append((pool, runner))
        return explorer, pool, monitor, weights

    yield make
    for pool, runner in built:
        runner.close()
        pool.close()


async def test_steps_write_batch_times_repeat_with_consistent_logprobs(parts):
    cfg = make_cfg()
    rows = generate(ArithSpec(), 7, seed=1)
    buffer = FakeBuffer({"arith": rows, "eval_arith": rows[:3]})
    explorer, pool, monitor, weights = parts(cfg, buffer)
    await explorer.run()
    exps = buffer.written["experience_buffer"]
    assert (
        len(exps) == 2 * 3 * 4
    )  # 2 full batches of 3 tasks (the 7th task is a partial batch), 4 rollouts each
    assert buffer.closed == [("experience_buffer", "explorer")]
    assert weights.asked == [1, 2]
    groups = {}
    for exp in exps:
        groups.setdefault(exp.group_id, []).append(exp)
        assert exp.model_version == 0 and exp.producer == "explorer" and exp.batch_id in (1, 2)
        exp.validate()
        recomputed = sequence_logprobs(pool[0].engine.model, exp.tokens.tolist(), exp.prompt_length)
        np.testing.assert_allclose(recomputed, exp.logprobs, atol=1e-4)
    assert sorted(len(g) for g in groups.values()) == [4] * 6
    assert all(sorted(e.run_id for e in g) == [0, 1, 2, 3] for g in groups.values())
    steps = [s for s, m in monitor.logged if "rollout/reward/mean" in m]
    assert steps == [1, 2]
    evals = [(s, m) for s, m in monitor.logged if any(k.startswith("eval/") for k in m)]
    assert [s for s, _ in evals] == [0, 2]  # on startup and every eval_interval=2 steps
    assert {"eval/eval_arith/accuracy/mean@2", "eval/eval_arith/accuracy/best@2"} <= set(evals[0][1])


async def test_explorer_leaves_the_weight_groups_after_the_last_steps_sync(parts):
    """With buffer.total_steps the explorer knows its last step: once that step's weights are
    loaded it leaves (a trainer publishing later must not wait for it in a weight group)."""
    rows = generate(ArithSpec(), 12, seed=4)
    cfg = make_cfg(eval_on_startup=False).model_copy(deep=True)
    cfg.buffer.total_steps = 2
    explorer, _, _, weights = parts(cfg, FakeBuffer({"arith": rows, "eval_arith": rows[:1]}))
    await explorer.run()
    assert weights.left_after == [1, 2]  # right after step 2's sync (the fake taskset itself goes on)
    unbounded, _, _, weights = parts(
        make_cfg(eval_on_startup=False), FakeBuffer({"arith": rows, "eval_arith": rows[:1]})
    )
    await unbounded.run()
    assert (
        weights.asked == [1, 2, 3, 4] and weights.left_after is None
    )  # the end shows only at the empty read


async def test_restart_resumes_at_next_batch(parts):
    cfg = make_cfg(eval_on_startup=False)
    rows = generate(ArithSpec(), 9, seed=2)
    buffer = FakeBuffer({"arith": rows, "eval_arith": rows[:1]})
    buffer.cursors[("arith", "explorer")] = 3  # a previous explorer consumed the first batch
    explorer, *_ = parts(cfg, buffer)
    await explorer.run()
    assert sorted({e.batch_id for e in buffer.written["experience_buffer"]}) == [2, 3]
    assert {e.task_id for e in buffer.written["experience_buffer"]} == {str(i) for i in range(3, 9)}


async def test_a_replayed_step_keeps_the_chunks_its_killed_predecessor_wrote(parts):
    """The rerun of the batch a killed explorer was handed (repeat_last) samples other rollouts
    under the same keys: the buffer refuses them (AlreadyExists) and the predecessor's stand."""
    cfg = make_cfg(eval_on_startup=False)
    rows = generate(ArithSpec(), 6, seed=2)
    buffer = FakeBuffer({"arith": rows, "eval_arith": rows[:1]})
    buffer.cursors[("arith", "explorer")] = buffer.previous[("arith", "explorer")] = 3  # handed batch 2
    mine = Experience(tokens=np.arange(3, dtype=np.int32), prompt_length=1, model_version=0, task_id="old")
    for group in range(3):  # the predecessor wrote step 2's groups (one row each here)
        key = f"explorer:arith:step2:round0:group{group}:part0"
        await buffer.write("experience_buffer", [mine], idempotency_key=key)
    explorer, *_ = parts(cfg, buffer)
    await explorer.run()
    assert [e.task_id for e in buffer.written["experience_buffer"]] == ["old"] * 3  # step 2 was written
    assert explorer.replayed_step == 2 and explorer.written == 0
    explorer.replayed_step = 0  # outside a replay the same clash is a bug (two explorers, one name)
    with pytest.raises(AlreadyExists):
        await explorer.writer.write(2, 0, 0, [mine, mine])


async def test_weight_update_changes_generation(parts, tmp_path):
    import torch
    from safetensors.torch import save_file

    cfg = make_cfg(eval_on_startup=False)
    cfg.explorer.rollout_model.seed = 7
    rows = generate(ArithSpec(), 6, seed=3)
    buffer = FakeBuffer({"arith": rows, "eval_arith": rows[:1]})
    explorer, pool, _, weights = parts(cfg, buffer, plan={2: (5, str(tmp_path))})
    model = pool[0].engine.model
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        state = {k: torch.randn_like(v) if v.dim() > 1 else v for k, v in state.items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    await explorer.run()
    exps = buffer.written["experience_buffer"]
    assert weights.loaded == [5]
    assert {e.model_version for e in exps if e.batch_id == 1} == {0}
    assert {e.model_version for e in exps if e.batch_id == 2} == {5}
    assert torch.equal(model.transformer.wte.weight, state["transformer.wte.weight"])
    recomputed = sequence_logprobs(model, exps[-1].tokens.tolist(), exps[-1].prompt_length)
    np.testing.assert_allclose(recomputed, exps[-1].logprobs, atol=1e-4)


async def test_bench_evaluates_each_checkpoint_in_order(parts, tmp_path):
    from safetensors.torch import save_file

    from services.explorer.engines.weights import list_step_dirs

    cfg = make_cfg()
    cfg.checkpoint_root_dir = str(tmp_path / "root")
    rows = generate(ArithSpec(), 4, seed=4)
    buffer = FakeBuffer({"arith": rows, "eval_arith": rows})
    explorer, pool, monitor, weights = parts(cfg, buffer)
    state = {k: v.clone() for k, v in pool[0].engine.model.state_dict().items()}
    full = tmp_path / "checkpoints" / "full"
    for step in (4, 2):
        (full / f"global_step_{step}" / "model").mkdir(parents=True)
        save_file(state, str(full / f"global_step_{step}" / "model" / "model.safetensors"))
    (tmp_path / "global_step_3").mkdir()  # a sync checkpoint directly under the run dir
    save_file(state, str(tmp_path / "global_step_3" / "model.safetensors"))
    found = list_step_dirs(str(full), str(tmp_path))
    assert [s for s, _ in found] == [2, 3, 4]
    scores = await explorer.bench(found)
    assert list(scores) == [2, 3, 4] and weights.loaded == [2, 3, 4]
    assert [s for s, m in monitor.logged] == [2, 3, 4]
    assert all(m["eval/eval_arith/tasks"] == 4 for _, m in monitor.logged)
    # eval reads as many tasks as runners can run at once (runner_per_model 4), not buffer.batch_size 3
    assert {size for name, size in buffer.reads if name == "eval_arith"} == {4}
    # every sample's answer is kept beside its question (4 tasks x repeat_times 2 per checkpoint)
    answers = [json.loads(line) for line in (pathlib.Path(cfg.run_dir) / "eval" / "answers.jsonl").open()]
    assert [a["model_version"] for a in answers] == [2] * 8 + [3] * 8 + [4] * 8
    assert {(a["task_id"], a["run_id"]) for a in answers} == {(str(i), r) for i in range(4) for r in (0, 1)}
    assert all(a["question"] and a["truth"] is not None and a["mode"] == cfg.mode for a in answers)


async def test_difficulty_feedback_and_missing_workflow(parts):
    cfg = make_cfg(eval_on_startup=False)
    cfg.buffer.explorer_input.taskset.task_selector.selector_type = "difficulty_based"
    rows = generate(ArithSpec(), 3, seed=6)
    buffer = FakeBuffer({"arith": rows, "eval_arith": rows[:1]})
    explorer, *_ = parts(cfg, buffer)
    await explorer.run()
    assert buffer.feedback == [
        ("arith", {"0": 0.0, "1": 0.0, "2": 0.0})
    ]  # the untrained model fails them all

    cfg.buffer.explorer_input.taskset.default_workflow_type = None
    from services.common.errors import InvalidArgument
    from services.common.experience import Task as WireTask

    with pytest.raises(InvalidArgument) as info:
        explorer.resolve(WireTask(taskset="arith", task_id="x"), 1)
    assert info.value.field == "buffer.explorer_input.taskset.default_workflow_type"


async def test_mixed_tasksets_are_read_under_the_mix_and_pass_rates_go_to_their_own_set(parts):
    from services.common.experience import Task as WireTask
    from services.explorer.runner import UnitResult
    from services.explorer.workflows import Task

    raw = make_cfg(eval_on_startup=False).model_dump(exclude_defaults=True)
    fmt = {"prompt_key": "question", "response_key": "answer"}
    raw["buffer"]["explorer_input"].pop("taskset")
    raw["buffer"]["explorer_input"]["tasksets"] = [
        {"name": "easy", "format": fmt, "task_selector": {"selector_type": "difficulty_based"}},
        {"name": "hard", "format": fmt},
    ]
    cfg = TrinityConfig.model_validate(raw)
    explorer, *_ = parts(cfg, FakeBuffer({}))
    assert explorer.taskset == "tasksets" and explorer.feedback_sets == {"easy"}

    def result(taskset: str, task_id: str, reward: float) -> UnitResult:
        exp = Experience(tokens=np.array([1, 2]), prompt_length=1, model_version=0, reward=reward)
        return UnitResult(Task(task_id=task_id, taskset=taskset), None, [exp])

    # both sets have a task "0": only easy's (reward 1 -> pass rate 1) is easy's to learn from
    await explorer.report_feedback(
        [result("easy", "0", 1.0), result("hard", "0", 0.0), result("easy", "1", 0.0)]
    )
    assert explorer.buffer.feedback == [("easy", {"0": 1.0, "1": 0.0})]
    with pytest.raises(Exception, match="tasksets\\[0\\]"):  # one without a workflow names where to set it
        explorer.resolve(WireTask(taskset="easy", task_id="x"), 1)


async def test_two_engines_share_the_work_and_both_take_new_weights(parts, tmp_path):
    import torch
    from safetensors.torch import save_file

    cfg = make_cfg(eval_on_startup=False, runner_per_model=2, rollout_model={"engine_num": 2})
    rows = generate(ArithSpec(), 6, seed=8)
    buffer = FakeBuffer({"arith": rows, "eval_arith": rows[:1]})
    explorer, pool, _, _ = parts(cfg, buffer, plan={2: (1, str(tmp_path))})
    assert len(pool) == 2 and len(explorer.runner.wrappers) == 4
    state = {k: v + 0.1 for k, v in pool[0].engine.model.state_dict().items()}
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    await explorer.run()
    assert all(engine.stats.sequences > 0 for engine in pool.engines)
    for engine in pool.engines:
        torch.testing.assert_close(
            engine.engine.model.state_dict()["transformer.h.0.attn.c_attn.weight"],
            state["transformer.h.0.attn.c_attn.weight"],
        )
    assert len(buffer.written["experience_buffer"]) == 2 * 3 * 4


async def test_save_input_keeps_what_the_pipeline_filtered_out(parts, tmp_path):
    # reward_filter at 0.5 drops the wrong answers before the write; save_input (Trinity's default
    # true) keeps every experience as it was before the operators, one JSON line each.
    import json

    rows = generate(ArithSpec(), 6, seed=2)
    cfg = make_cfg(eval_on_startup=False).model_copy(deep=True)
    cfg.checkpoint_root_dir = str(tmp_path)
    cfg.data_processor = type(cfg.data_processor).model_validate(
        {"experience_pipeline": {"operators": [{"name": "reward_filter", "args": {"threshold": 0.5}}]}}
    )
    buffer = FakeBuffer({"arith": rows, "eval_arith": rows[:1]})
    explorer, _, _, _ = parts(cfg, buffer)
    await explorer.run()
    saved = tmp_path / "trinity-grpc" / "default" / "buffer" / "pipeline_input.jsonl"
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    written = buffer.written.get("experience_buffer", [])
    assert len(lines) == 2 * 3 * 4  # every rollout, before the filter
    assert sorted(line["step"] for line in lines) == [1] * 12 + [2] * 12
    assert len(written) == sum(line["reward"] >= 0.5 for line in lines) < len(lines)
    by_group = {(e.group_id, e.run_id): e for e in written}
    for line in lines:
        assert len(line["tokens"]) == line["prompt_length"] + line["response_length"]
        assert len(line["logprobs"]) == line["response_length"]
        if (line["group_id"], line["run_id"]) in by_group:
            assert line["tokens"] == by_group[line["group_id"], line["run_id"]].tokens.tolist()


async def test_save_input_false_or_no_operators_writes_no_file(parts, tmp_path):
    rows = generate(ArithSpec(), 3, seed=2)
    for pipeline in (
        {"operators": [{"name": "reward_filter"}], "save_input": False},
        {"operators": []},
    ):
        cfg = make_cfg(eval_on_startup=False).model_copy(deep=True)
        cfg.checkpoint_root_dir = str(tmp_path)
        cfg.data_processor = type(cfg.data_processor).model_validate({"experience_pipeline": pipeline})
        explorer, _, _, _ = parts(cfg, FakeBuffer({"arith": rows, "eval_arith": rows[:1]}))
        await explorer.run()
        assert not list(tmp_path.rglob("pipeline_input.jsonl"))


async def test_a_cod_section_runs_each_batch_as_packs_scored_by_the_cod_advantage(make_model, tmp_path):
    # 3 lake tasks ("SG": Direction 2 is Right, the goal; 4 is Left, the edge; one move each) in
    # packs of 2, padded: [t0 t1] [t2 t0]; 4 runs each, one at a time (one slot), so the scripted
    # replies go run by run: solve, hint, solve, the first solve won on even runs and lost on odd ones
    from services.explorer.runner import WorkflowRunner
    from services.explorer.workflows.cod.hints import HINT_END, HINT_START

    cfg = TrinityConfig.model_validate(
        {
            "mode": "explore",
            "algorithm": {
                "algorithm_type": "multi_step_grpo",
                "repeat_times": 4,
                "advantage_fn": "cod",
                "advantage_fn_args": {"iterative_hint_e2e_causal": True},
            },
            "model": {"model_path": "builtin:tiny-arith"},
            "buffer": {
                "batch_size": 3,
                "total_steps": 1,
                "explorer_input": {
                    "taskset": {
                        "name": "lake",
                        "default_workflow_type": "cod_frozenlake_obscure_workflow",
                        "workflow_args": {"desc": ["SG"], "agent_max_steps": 1},
                    }
                },
            },
            "monitor": {"monitor_type": "none"},
            "cod": {
                "task_pack_size": 2,
                "cod_workflow_args": {
                    "pad_tasks_to_full_pack": True,
                    "log_dir": str(tmp_path),
                    "exp_name": "x",
                },
            },
        }
    )
    replies = []
    for run in range(8):
        first = 2 if run % 2 == 0 else 4
        replies += [f"<answer>Direction {first}</answer>", f"{HINT_START}\n- 2 is right\n{HINT_END}"]
        replies += ["<answer>Direction 2</answer>"]
    model, _ = make_model(replies)
    runner = WorkflowRunner(
        lambda i: model, slots=1, max_timeout=60, max_retry_times=0, version_fn=VersionRef()
    )
    buffer = FakeBuffer({"lake": [{"seed": i} for i in range(3)]}, cfg=cfg)
    explorer = Explorer(
        cfg, buffer=buffer, weights=FakeWeightSync([]), runner=runner, monitor=RecordingMonitor()
    )
    await explorer.run()
    exps = buffer.written["experience_buffer"]
    groups: dict[str, list[Experience]] = {}
    for exp in exps:
        groups.setdefault(exp.group_id, []).append(exp)
    assert len(groups) == 2 and all(len(g) == 4 * 3 for g in groups.values())
    for rows in groups.values():
        by_run = {e.run_id: e.info["task_rewards"] for e in rows}
        assert by_run == {0: [1.0, 1.0], 1: [0.0, 1.0], 2: [1.0, 1.0], 3: [0.0, 1.0]}
        # solve 0: returns mean[1, 1] = 1 or mean[0, 1] = 0.5 against 0.75 -> +-0.25; the hint update
        # (reward 0) and solve 1 return the same in every run -> 0
        for exp in rows:
            expected = 0.0
            if exp.info["exp_type"] == "solve_task" and exp.info["task_idx"] == 0:
                expected = 0.25 if exp.run_id % 2 == 0 else -0.25
            assert exp.advantages[0] == pytest.approx(expected)
    # step 1 is logged (every cod_log_interval steps from the first): one file per pack run
    assert len(list((tmp_path / "x" / "rollout_step_1").iterdir())) == 8
