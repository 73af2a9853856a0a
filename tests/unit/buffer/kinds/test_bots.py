"""BOTS (difficulty_based with feature_keys): the estimator's update and selection against numbers
worked by hand, its config checks, and a taskset in a real SQLite file that feedback steers toward
tasks near target_reward and that keeps its estimates across a buffer restart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from services.buffer.core import BufferCore, Defaults
from services.buffer.kinds import bots
from services.buffer.types import BufferSpec
from services.cli.config_check import check_file
from services.common.config import validate_config
from services.common.config.buffer import BotsConfig
from services.common.config.tasksets import TasksetDefaults
from services.common.errors import ConfigError, InvalidArgument
from tests.conftest import REPO

BOTS_YAML = REPO / "tests" / "data" / "trinity-v0.5.2-examples" / "bots" / "bots.yaml"
# f0 (weaker model), f1 (stronger model) per task
FEATURES = np.array([[0.2, 0.6], [0.4, 0.8], [0.6, 1.0]])
ARGS = BotsConfig(m=4, lamb=0.5, rho=0.5)


def test_first_update_by_hand() -> None:
    # batch I = {0, 1}, r = [0.5, 1.0]: mean r 0.75, mean f0 0.3, mean f1 0.7
    # c = (0.75 - 0.3) / (0.7 - 0.3 + 1e-6) = 1.125 (less 3e-6)
    # p~ = clip(f0 + 1.125 * 0.4) = [0.65, 0.85, 1.05 -> 1.0]; on I p~ = r: [0.5, 1.0, 1.0]
    # s = m r = [2, 4, 0], f = m (1 - r) = [2, 0, 0] (0 outside I)
    # alpha = 0.5 * 1 + 0.5 + 0.5 * s + 0.5 * 4 * p~ = 1 + [1, 2, 0] + [1, 2, 2] = [3, 5, 3]
    # beta  = 0.5 * 1 + 0.5 + 0.5 * f + 0.5 * 4 * (1 - p~) = 1 + [1, 0, 0] + [1, 0, 0] = [3, 1, 1]
    state = bots.update(bots.initial_state(3), FEATURES, ARGS, [0, 1], [0.5, 1.0])
    assert state.alphas.tolist() == [3.0, 5.0, 3.0] and state.betas.tolist() == [3.0, 1.0, 1.0]
    assert state.cap_coef == pytest.approx(1.125, abs=1e-5) and state.updates == 1


def test_second_update_smooths_the_capability_by_hand() -> None:
    # from alpha [3, 5, 3], beta [3, 1, 1], c 1.125; batch I = {2}, r = [0.0]
    # c_est = (0 - 0.6) / (1.0 - 0.6) = -1.5; c = 0.9 * 1.125 + 0.1 * -1.5 = 0.8625
    # p~ = f0 + 0.8625 * 0.4 = f0 + 0.345 = [0.545, 0.745, 0.945]; on I: [0.545, 0.745, 0]
    # alpha = 0.5 * [3, 5, 3] + 0.5 + 0 + 2 * p~ = [2, 3, 2] + [1.09, 1.49, 0] = [3.09, 4.49, 2]
    # beta = 0.5 * [3, 1, 1] + 0.5 + 0.5 * [0, 0, 4] + 2 * (1 - p~)
    #      = [2, 1, 1] + [0, 0, 2] + [0.91, 0.51, 2] = [2.91, 1.51, 5]
    first = bots.update(bots.initial_state(3), FEATURES, ARGS, [0, 1], [0.5, 1.0])
    state = bots.update(first, FEATURES, ARGS, [2], [0.0])
    assert state.cap_coef == pytest.approx(0.8625, abs=1e-5)
    assert state.alphas == pytest.approx([3.09, 4.49, 2.0], abs=1e-5)
    assert state.betas == pytest.approx([2.91, 1.51, 5.0], abs=1e-5)
    assert state.rho_halvings == 0 and first.alphas.tolist() == [3.0, 5.0, 3.0]  # states are values


def test_adaptive_rho_halves_rho_when_the_interpolation_misses() -> None:
    # first update: |p~ - r| on I = [|0.65 - 0.5|, |0.85 - 1.0|], mean 0.15 < 0.25: rho stays 0.5
    # second: |0.945 - 0| >= 0.25: rho 0.25 for this update already
    # alpha = [1.5, 2.5, 1.5] + 0.5 + 0.75 * 0 + 0.25 * 4 * p~ = [2, 3, 2] + [0.545, 0.745, 0]
    # beta = [1.5, 0.5, 0.5] + 0.5 + 0.75 * [0, 0, 4] + 1 * (1 - p~) = [2.455, 1.255, 5]
    args = BotsConfig(m=4, lamb=0.5, rho=0.5, adaptive_rho=True)
    first = bots.update(bots.initial_state(3), FEATURES, args, [0, 1], [0.5, 1.0])
    state = bots.update(first, FEATURES, args, [2], [0.0])
    assert (first.rho_halvings, state.rho_halvings, state.rho(args)) == (0, 1, 0.25)
    assert state.alphas == pytest.approx([2.545, 3.745, 2.0], abs=1e-5)
    assert state.betas == pytest.approx([2.455, 1.255, 5.0], abs=1e-5)


def test_greedy_selection_takes_the_tasks_nearest_target_reward() -> None:
    # means alpha / (alpha + beta) = [3/6, 5/6, 3/4] = [0.5, 0.833, 0.75]
    state = bots.BotsState(np.array([3.0, 5.0, 3.0]), np.array([3.0, 1.0, 1.0]))
    assert bots.select(state, BotsConfig(target_reward=0.5, tau=0), 2, seed=0) == [0, 2]
    assert bots.select(state, BotsConfig(target_reward=1.0, tau=0), 2, seed=0) == [1, 2]
    assert bots.select(bots.initial_state(4), BotsConfig(tau=0), 2, seed=0) == [0, 1]  # ties: lower row


def test_sampled_selection_is_fixed_by_the_seed() -> None:
    state = bots.BotsState(np.array([3.0, 5.0, 3.0, 1.0]), np.array([3.0, 1.0, 1.0, 9.0]))
    for args in (BotsConfig(tau=0, do_sample=True), BotsConfig(tau=0.5), BotsConfig(tau=0.5, do_sample=True)):
        picks = [bots.select(state, args, 2, seed) for seed in range(30)]
        assert picks == [bots.select(state, args, 2, seed) for seed in range(30)]
        assert len({tuple(p) for p in picks}) > 1 and all(len(set(p)) == 2 for p in picks)
    # a tiny tau underflows most softmax weights to 0 and still yields k distinct rows, best first
    assert bots.select(state, BotsConfig(target_reward=0.5, tau=1e-6), 3, seed=1) == [0, 2, 1]


def _selector(**selector: object) -> dict[str, object]:
    return {"buffer": {"explorer_input": {"taskset": {"name": "t", "data_selector": selector}}}}


def test_config_checks_of_feature_keys_and_kwargs() -> None:
    keys = ["weak", "strong"]
    cfg = validate_config(_selector(selector_type="difficulty_based", feature_keys=keys, kwargs={"tau": 0}))
    taskset = cfg.buffer.explorer_input.taskset
    assert taskset is not None and taskset.selector.kwargs.tau == 0 and taskset.selector.kwargs.m == 16
    with pytest.raises(ConfigError, match="feature_keys drive the difficulty_based selector, not 'shuffle'"):
        validate_config(_selector(selector_type="shuffle", feature_keys=keys))
    for bad in (["weak"], ["a", "b", "c"], ["a", "a"]):
        with pytest.raises(ConfigError, match="feature_keys needs exactly 2 different columns"):
            validate_config(_selector(selector_type="difficulty_based", feature_keys=bad))
    with pytest.raises(
        ConfigError, match="kwargs are the arguments of BOTS's estimator, which needs feature_keys"
    ):
        validate_config(_selector(selector_type="difficulty_based", kwargs={"m": 8}))
    with pytest.raises(
        ConfigError,
        match=r"data_selector\.kwargs\.beta: unknown key; allowed keys here: adaptive_rho, do_sample, lamb, m",
    ):
        validate_config(_selector(selector_type="difficulty_based", feature_keys=keys, kwargs={"beta": 1}))
    with pytest.raises(ConfigError, match=r"data_selector\.kwargs\.tau: Input should be greater than"):
        validate_config(_selector(selector_type="difficulty_based", feature_keys=keys, kwargs={"tau": -1}))
    with pytest.raises(ConfigError, match="temperature belong to the pass-rate selector"):
        validate_config(_selector(selector_type="difficulty_based", feature_keys=keys, temperature=0.5))


def test_trinity_bots_example_has_no_unknown_key() -> None:
    cfg, report = check_file(str(BOTS_YAML), [])
    assert not [p for p in report.problems if "unknown key" in p], report.problems
    assert cfg is not None and cfg.buffer.explorer_input.taskset is not None
    selector = cfg.buffer.explorer_input.taskset.selector
    assert selector.feature_keys == ["qwen2.5_7b_pass_rate", "qwen3_30b_pass_rate"]
    assert (selector.kwargs.m, selector.kwargs.lamb, selector.kwargs.rho) == (16, 0.1, 0.1)
    assert (selector.kwargs.target_reward, selector.kwargs.tau, selector.kwargs.do_sample) == (0.5, 0, True)


# ---- through the buffer core, in a real SQLite file -----------------------------------------
TRUE_RATES = [0.0, 0.1, 0.5, 0.55, 0.9, 1.0]  # what the policy scores on t0..t5


def write_tasks(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def bots_rows(shift: float = 0.2) -> list[dict[str, object]]:
    """Priors on either side of each task's true pass rate."""
    return [
        {"id": f"t{i}", "question": f"q{i}", "weak": max(0.0, p - shift), "strong": min(1.0, p + shift)}
        for i, p in enumerate(TRUE_RATES)
    ]


def bots_spec(path: str) -> BufferSpec:
    kwargs = {"m": 16, "lamb": 0.1, "rho": 0.1, "target_reward": 0.5, "tau": 0}
    selector = {"selector_type": "difficulty_based", "feature_keys": ["weak", "strong"], "kwargs": kwargs}
    return BufferSpec("bots", "taskset", {"path": path, "total_steps": 100, "data_selector": selector})


async def open_core(tmp_path: Path, spec: BufferSpec) -> BufferCore:
    core = BufferCore(
        str(tmp_path / "data"), Defaults(tasksets=TasksetDefaults(workflow="math_workflow", repeat_times=4))
    )
    await core.start([spec])
    return core


async def test_feedback_steers_the_taskset_to_target_and_survives_a_restart(tmp_path: Path) -> None:
    spec = bots_spec(write_tasks(tmp_path / "t.jsonl", bots_rows()))
    core = await open_core(tmp_path, spec)
    batches = []
    for _ in range(6):
        batch = await core.read_tasks("bots", 2, reader_id="explorer")
        batches.append(sorted(t.index for t in batch.tasks))
        await core.report_feedback("bots", [(t.task_id, TRUE_RATES[t.index]) for t in batch.tasks])
    assert batches[0] == [0, 1]  # all Beta(1, 1) at first: a tie, taken in row order
    assert batches[2:] == [[2, 3]] * 4  # the tasks solved about half the time
    before = core.taskset("bots").bots_state
    await core.close()

    core = await open_core(tmp_path, spec)
    after = core.taskset("bots").bots_state
    assert np.array_equal(after.alphas, before.alphas) and np.array_equal(after.betas, before.betas)
    assert (after.cap_coef, after.updates) == (before.cap_coef, 6)
    batch = await core.read_tasks("bots", 2, reader_id="explorer")
    assert sorted(t.index for t in batch.tasks) == [2, 3] and batch.batch_index == 6
    await core.close()

    write_tasks(tmp_path / "t.jsonl", bots_rows(shift=0.3))  # other priors: estimates start over
    core = await open_core(tmp_path, spec)
    assert core.taskset("bots").bots_state.updates == 0
    await core.close()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "t1", "weak": 0.5}, r"row 1 \(task 't1'\) has no column 'strong'"),
        (
            {"id": "t1", "weak": 0.5, "strong": 1.5},
            r"row 1 \(task 't1'\): column 'strong' must be a pass rate",
        ),
        (
            {"id": "t1", "weak": "easy", "strong": 0.5},
            r"row 1 \(task 't1'\): column 'weak' must be a pass rate",
        ),
        (
            {"id": "t1", "weak": None, "strong": 0.5},
            r"column 'weak' must be a pass rate in \[0, 1\], got None",
        ),
    ],
)
async def test_a_bad_feature_value_names_the_column_and_the_row(
    tmp_path: Path, row: dict[str, object], message: str
) -> None:
    path = write_tasks(tmp_path / "t.jsonl", [{"id": "t0", "weak": 0.1, "strong": 0.2}, row])
    core = await open_core(tmp_path, BufferSpec("other", "taskset", {"path": path}))
    with pytest.raises(InvalidArgument, match=message) as err:
        await core.create(bots_spec(path))
    assert err.value.field == "feature_keys"
    await core.close()
