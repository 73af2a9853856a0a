"""multi_step_grpo's plumbing: step ids, the explorer-side operator, the trainer's signal adapters.

Numbers are worked by hand in the comments (the same cases as tests/unit/algorithms/
test_trinity_advantages.py, here through Experience rows).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from services.algorithms.advantage import ADVANTAGE_FN
from services.common.config.algorithm import AlgorithmConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.common.wire import experience_from_proto, experience_to_proto
from services.explorer.pipeline import EXPERIENCE_OPERATORS
from services.explorer.pipeline.step_wise import StepWiseGRPO, explorer_side_advantage
from services.trainer.batching import build_batch


def row(group: str, run: int, step: int, reward: float, mask: tuple[bool, ...] = (True, True)) -> Experience:
    return Experience(
        tokens=np.arange(1, 2 + len(mask), dtype=np.int64),
        prompt_length=1,
        model_version=0,
        reward=reward,
        action_mask=np.array(mask),
        group_id=group,
        run_id=run,
        step=step,
    )


def two_tasks() -> list[Experience]:
    # task A: run 0 = steps 0 (reward 0), 1 (final reward 1; its mask hides an environment token);
    # run 1 = one step, reward 0. Task B: one run, reward 5.
    return [
        row("A", 0, 0, 0.0),
        row("A", 1, 0, 0.0),
        row("A", 0, 1, 1.0, (True, False)),
        row("B", 0, 0, 5.0),
    ]


A = 0.5 / (math.sqrt(0.5) + 1e-6)  # A's finals 1, 0: mean 0.5, unbiased std sqrt(0.5)
B = 5.0 / (1.0 + 1e-6)  # a task with one run: mean 0, std 1


def test_operator_broadcasts_each_runs_final_advantage_over_its_steps_and_masks() -> None:
    exps, metrics = StepWiseGRPO().process(two_tasks())
    advantages = [e.advantages.tolist() for e in exps]
    assert np.allclose(advantages[0], [A, A]) and np.allclose(advantages[1], [-A, -A])
    assert np.allclose(advantages[2], [A, 0.0]) and np.allclose(advantages[3], [B, B])
    assert all(np.array_equal(e.returns, e.advantages) for e in exps)
    assert metrics["runs"] == 3 and metrics["steps_per_run"] == pytest.approx(4 / 3)


def test_operator_step_norm_threshold_and_none_level() -> None:
    exps, _ = StepWiseGRPO(enable_step_norm=True).process(two_tasks())
    assert np.allclose(exps[0].advantages, [A / 2, A / 2])  # run 0 has two steps
    exps, metrics = StepWiseGRPO(std_threshold=0.0).process(two_tasks())
    assert [e.group_id for e in exps] == ["A", "A", "A"] and metrics["filtered_count"] == 1
    exps, _ = StepWiseGRPO(std_cal_level="none").process(two_tasks())
    assert np.allclose(exps[0].advantages, [0.5, 0.5]) and np.allclose(exps[3].advantages, [5.0, 5.0])
    with pytest.raises(InvalidArgument) as err:
        StepWiseGRPO(std_cal_level="task")
    assert err.value.field == "algorithm.advantage_fn_args.std_cal_level"


def test_operator_takes_the_later_row_when_steps_tie() -> None:
    # a run whose two calls both say step 0: the later row is the last step (reward 1 -> its run's A)
    exps, _ = StepWiseGRPO().process([row("A", 0, 0, 0.0), row("A", 0, 0, 1.0), row("A", 1, 0, 0.0)])
    assert np.allclose(exps[0].advantages, [A, A]) and np.allclose(exps[2].advantages, [-A, -A])


def test_explorer_runs_the_operator_only_for_step_wise_advantages() -> None:
    cfg = SimpleNamespace(
        algorithm=AlgorithmConfig(algorithm_type="multi_step_grpo", advantage_fn_args={"epsilon": 0.5})
    )
    name, op = explorer_side_advantage(cfg)  # type: ignore[misc]
    assert name == "step_wise_grpo" and isinstance(op, StepWiseGRPO) and op.args["epsilon"] == 0.5
    assert explorer_side_advantage(SimpleNamespace(algorithm=AlgorithmConfig(algorithm_type="grpo"))) is None
    assert EXPERIENCE_OPERATORS.get("step_wise_grpo") is StepWiseGRPO


def test_trainer_adapter_gives_the_operators_numbers_for_rows_without_advantages() -> None:
    batch = build_batch(two_tasks(), pad_token_id=0).train
    assert batch.step_index is not None and batch.step_index.tolist() == [0, 0, 1, 0]
    assert batch.run_index is not None and batch.run_index.tolist() == [0, 1, 0, 2]
    out = ADVANTAGE_FN.get("step_wise_grpo")(batch)
    assert torch.allclose(out.advantages, torch.tensor([[A, A], [-A, -A], [A, 0.0], [B, B]]), atol=1e-5)


def test_distill_adapters_read_teacher_logprobs() -> None:
    exps = [row("A", 0, 0, 0.0), row("A", 1, 0, 0.0, (True, False))]
    for e in exps:
        e.logprobs = np.log(np.array([0.5, 0.5], dtype=np.float32))
        e.teacher_logprobs = np.log(np.array([0.25, 0.5], dtype=np.float32))
    batch = build_batch(exps, pad_token_id=0).train
    # on_policy_distill: kl_coef * (log 0.25 - log 0.5) = -log 2 on the first token, 0 where equal
    out = ADVANTAGE_FN.get("on_policy_distill")(batch, kl_coef=2.0)
    assert torch.allclose(out.advantages, torch.tensor([[-2 * math.log(2), 0.0], [-2 * math.log(2), 0.0]]))
    # jsd, lambda 0.5: p_s 0.5, p_t 0.25, M 0.375; JSD = 0.5 * 0.25 * log(0.25 / 0.375)
    #   + 0.5 * 0.5 * log(0.5 / 0.375) = -0.050683 + 0.071921 = 0.021238; equal p -> 0
    out = ADVANTAGE_FN.get("jsd")(batch)
    assert torch.allclose(out.advantages[:, 0], torch.tensor([-0.021238, -0.021238]), atol=1e-5)
    assert torch.allclose(out.advantages[:, 1], torch.zeros(2), atol=1e-6)


def test_step_and_teacher_logprobs_cross_the_wire_and_eid_is_trinitys_view() -> None:
    exp = row("A", 2, 0, 1.0)
    exp.eid.step = 3
    exp.teacher_logprobs = np.array([-0.5, -1.5], dtype=np.float32)
    back = experience_from_proto(experience_to_proto(exp))
    assert back.step == 3 and back.eid.run == 2 and back.eid.step == 3
    assert back.teacher_logprobs is not None and back.teacher_logprobs.tolist() == [-0.5, -1.5]
    exp.teacher_logprobs = np.zeros(5, dtype=np.float32)
    with pytest.raises(InvalidArgument) as err:
        exp.validate()
    assert err.value.field == "experience.teacher_logprobs"
    with pytest.raises(AttributeError, match="suffix"):
        _ = exp.eid.suffix


def test_clipb_adapter_masks_negative_tokens_with_a_low_entropy_signal() -> None:
    # one group, rewards 1 and 0: GRPO A = +-0.5 / (sqrt(0.5) + 1e-6) = +-a. old logprob 0 (p = 1), so
    # S = entropy = [0, 0 | 0, 4]: mean 1, population std sqrt(3); mu 0.5 -> cut at -0.866.
    # Row 1 (A < 0): token 0 has S - mean = -1 -> dropped; token 1 has +3 -> kept. Row 0 (A > 0): kept.
    exps = [row("A", 0, 0, 1.0), row("A", 1, 0, 0.0)]
    batch = build_batch(exps, pad_token_id=0).train
    batch.token_level_rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    batch.entropy = torch.tensor([[0.0, 0.0], [0.0, 4.0]])
    out = ADVANTAGE_FN.get("clipb")(batch, mu=0.5)
    assert torch.allclose(out.advantages, torch.tensor([[A, A], [0.0, -A]]), atol=1e-5)
    assert out.metrics["clipb/dropped_frac"] == 0.25


def test_trainer_fills_the_current_models_entropy_for_clipb() -> None:
    from services.trainer.algorithms import build_algorithm
    from services.trainer.engine import TrainEngine
    from services.trainer.settings import EngineSettings
    from tests.fakes.trainer import experience, tiny_model

    algo = build_algorithm(
        AlgorithmConfig(algorithm_type="grpo", advantage_fn="clipb", kl_loss_fn="none", repeat_times=2)
    )
    assert algo.needs_entropy
    engine = TrainEngine(tiny_model(), algo, EngineSettings())
    rows = [experience("1+2=", "3", task_id="t", logprobs=True), experience("1+2=", "34", task_id="t")]
    rows[0].reward, rows[1].reward = 1.0, 0.0
    batch = build_batch(rows, pad_token_id=0)
    engine.prepare(batch)
    entropy = batch.train.entropy
    assert entropy is not None and bool((entropy[1, :2] > 0).all()) and entropy[0, 1].item() == 0.0
    _, want = engine.policy(batch.inputs.select(torch.tensor([1])), with_entropy=True)
    assert want is not None and torch.allclose(entropy[1, :2], want[0, :2].detach(), atol=1e-5)
