"""The four actions of a task's lab: what each accepts and refuses (feedback, the task goes on), and the
reward of a committed equation against the hidden one, worked by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.explorer.workflows.cod.pde.lab import PdeLab, grid_points, hidden_reward
from services.explorer.workflows.cod.pde.settings import PdePack, PdeSettings
from services.explorer.workflows.cod.pde.terms import LIBRARY

HIDDEN = {"u": -1.0, "u**3": -0.5}
ARGS = {
    "pde_state_abs_limit": 3.0, "initial_condition_shape": {"mode_count_range": [1, 2]},
    "pde_grid_size": 33, "pde_time_steps": 101, "noise_level": 0.0, "point_budget": 6,
}  # fmt: skip


def lab(position: int = 1, pack: PdePack | None = None, **args: Any) -> PdeLab:
    settings = PdeSettings.from_args({**ARGS, **args})
    pack = pack or PdePack(dict(HIDDEN), None, 3, trajectories=2, amplitude_upper=2.0)
    return PdeLab(settings, pack, position=position, seed=11)


def grid(*pairs: tuple[float, float]) -> dict[str, Any]:
    return {"point_grid": {"point": [{"x": str(x), "t": str(t)} for x, t in pairs]}}


def test_the_reward_against_the_hidden_equation_by_hand() -> None:
    lib = list(LIBRARY)
    assert hidden_reward(dict(HIDDEN), HIDDEN, lib)["reward"] == 1.0
    # -u alone: |0 - (-0.5)| / (1 + 0.5) = 1/3 -> 1 / (1 + 1/3) = 0.75
    assert hidden_reward({"u": -1.0}, HIDDEN, lib) == pytest.approx(
        {"l1": 1 / 3, "extra_support": 0.0, "loss": 1 / 3, "reward": 0.75}
    )
    # a third term: l1 0.1 / 1.5 = 1/15 plus one extra term -> loss 16/15, reward 15/31
    wrong = hidden_reward({"u": -1.0, "u**3": -0.5, "sin(u)": 0.1}, HIDDEN, lib)
    assert wrong["loss"] == pytest.approx(16 / 15) and wrong["reward"] == pytest.approx(15 / 31)


def test_point_grids() -> None:
    assert grid_points({"point": {"x": "0.5", "t": "0"}}) == [(0.5, 0.0)]
    for bad in (
        {"point": {"x": "0", "t": "0.5"}},
        {"point": {"x": "0.5"}},
        {"point": {"x": "a", "t": "1"}},
        "",
    ):
        assert grid_points(bad) is None


def test_sampling_spends_the_budget_and_stores_the_data_for_the_pack() -> None:
    one = lab()
    feedback, done, bad = one.act("sample_pde_data", grid((0.25, 0.0), (0.5, 0.5), (0.75, 1.0)))
    assert (done, bad, one.budget) == (False, False, 3) and "dataset ds_t1_1" in feedback
    data = one.pack.datasets["ds_t1_1"]
    fields = one.pack.simulated(one.settings)
    # x = 0.25 and t = 0 is a node of the 33 x 101 grid: the exact state, noise 0
    assert data["u"][0] == pytest.approx(fields["u"][0, 0, 8]) and data["y"][0] == pytest.approx(
        fields["y"][0, 0, 8]
    )
    assert (
        one.act("sample_pde_data", grid(*[(0.5, 0.1)] * 4))[0]
        == "Error: 4 points asked for, 3 left in the budget."
    )
    assert one.act("sample_pde_data", {"points": "0.5,0.5"})[0].startswith(
        "Error: sample_pde_data takes a point_grid"
    )
    assert one.act("sample_pde_data", grid((1.0, 0.5)))[0].startswith("Error: every point of point_grid")
    # the next task of the pack watches the other trajectory and sees the first task's data
    two = lab(position=2, pack=one.pack)
    two.act("sample_pde_data", grid((0.25, 0.0)))
    assert sorted(two.pack.datasets) == ["ds_t1_1", "ds_t2_2"] and two.trajectory == 1
    assert two.pack.datasets["ds_t2_2"]["u"][0] == pytest.approx(fields["u"][1, 0, 8])
    assert len(two.dataset("merged_all")["u"]) == 4 and len(two.dataset("merged_t2_t2")["u"]) == 1
    assert two.dataset("merged_t3_t4") is None and two.dataset("nope") is None


def test_a_regression_then_a_commitment_of_a_scored_equation() -> None:
    one = lab()
    one.act("sample_pde_data", grid(*[(x, t) for x in (0.2, 0.5, 0.8) for t in (0.0, 0.3)]))
    feedback, done, _ = one.act("run_sparse_regression", {"dictionary": ["u", "u**3", "sin(u)"]})
    assert not done and "Best fit: f(u) =" in feedback and "Errors at the sampled points: (x=0.2" in feedback
    best = one.last_scored[0]
    assert set(best["support"]) == {"u", "u**3"}
    assert best["coefficients"]["u"] == pytest.approx(-1.0, abs=0.05)
    refused = one.act("update_scientific_context", {"preferred_equation": "-1*u - 0.5*u**3"})
    assert refused == (
        "Error: preferred_equation must be one the latest run_sparse_regression scored.",
        False,
        False,
    )
    feedback, done, bad = one.act(
        "update_scientific_context",
        {"preferred_equation": best["equation"], "note": "cubic  damping", "uncertain_terms": ["sin(u)"]},
    )
    assert (done, bad, one.committed) == (True, False, True) and feedback.startswith("Task over.")
    assert one.reward == pytest.approx(hidden_reward(best["coefficients"], HIDDEN, list(LIBRARY))["reward"])
    assert one.reward > 0.9
    assert one.pack.preferred_equation == best["equation"] and one.pack.last_update["note"] == "cubic damping"
    assert one.pack.history == [{"position": 1, "equation": best["equation"]}]


@pytest.mark.parametrize(
    ("args", "starts"),
    [
        ({}, "Error: update_scientific_context needs a preferred_equation"),
        (
            {"preferred_equation": "c1*u + c2*u**3"},
            "Error: preferred_equation has placeholder coefficients (c1, c2)",
        ),
        ({"preferred_equation": "-1*u"}, "Error: sample data in this task"),
        ({"preferred_equation": "-1*u", "uncertain_terms": ["u"] * 5}, "Error: at most 4 uncertain_terms."),
    ],
)
def test_a_commitment_needs_an_equation_and_this_tasks_own_evidence(
    args: dict[str, Any], starts: str
) -> None:
    feedback, done, bad = lab().act("update_scientific_context", args)
    assert feedback.startswith(starts) and not done and not bad


def test_regression_arguments_are_checked() -> None:
    one = lab()
    assert (
        one.act("run_sparse_regression", {"dictionary": ["u"]})[0]
        == "Error: dataset_id 'merged_all' was not found."
    )
    one.act("sample_pde_data", grid((0.3, 0.2), (0.6, 0.4)))
    for args, message in [
        ({}, "Error: run_sparse_regression needs a dictionary or candidate_equations."),
        ({"dictionary": ""}, "Error: dictionary must be a non-empty list of library terms."),
        ({"dictionary": ["cos(u)"]}, "Error: dictionary names none of the library's terms."),
        ({"candidate_equations": ["1*u"] * 9}, "Error: at most 8 candidate_equations."),
        (
            {"candidate_equations": ["2*x"]},
            "Error: candidate_equations use none of the selected library terms.",
        ),
        ({"dictionary": ["u"], "threshold": "x"}, "Error: alpha and threshold must be numbers."),
        ({"dictionary": ["u"], "alpha": "-1"}, "Error: alpha and threshold must be finite and >= 0."),
    ]:
        assert one.act("run_sparse_regression", args) == (message, False, False)
    feedback, _, _ = one.act("run_sparse_regression", {"dictionary": ["u", "cos(u)"]})
    assert "Ignored, not library terms: cos(u)." in feedback
    # candidate equations without a dictionary: their terms are the selection, each support refitted
    one.act("run_sparse_regression", {"candidate_equations": ["u + u**3", "0.5*tanh(u)"]})
    assert one.last_selection == ["u", "u**3", "tanh(u)"] and len(one.last_scored) == 2


def test_pack_evidence_and_unknown_actions() -> None:
    pack = PdePack(dict(HIDDEN), None, 3, trajectories=2, amplitude_upper=2.0)
    first = lab(pack=pack)
    assert first.act("summarize_pack_evidence", {})[0].startswith("Pack evidence: no earlier task")
    pack.history = [{"position": 1, "equation": "-1*u"}]
    hidden, _, _ = first.act("summarize_pack_evidence", {"reveal_equations": "false"})
    shown, _, _ = first.act("summarize_pack_evidence", {"reveal_equations": "TRUE"})
    assert (
        "H1: tasks 1." in hidden and "-1*u" not in hidden and "H1: tasks 1; recorded equation -1*u." in shown
    )
    assert first.act("summarize_pack_evidence", {"reveal_equations": "maybe"})[0].startswith("Error:")
    assert first.act("fly", {}) == ("Invalid action: unknown action 'fly'. Game over.", True, True)
    assert first.act("sample_pde_data", "0.5")[1:] == (True, True)
    assert np.isfinite(first.settings.noise)
