"""rlcr_reward against parts worked by hand (default weights 0.5, 0.5, 0.5, 1e-5, 1e-5)."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.rewards.rlcr import RLCRReward


def reply(answer: str, q: str, tail: str = "") -> str:
    return f"<think>2+2</think>\n<answer>{answer}</answer> <analysis>checked</analysis><confidence>{q}</confidence>{tail}"


def parts(response: str, truth: str | None = "4", **args: object) -> dict[str, float]:
    return REWARD_FUNCTIONS.get("rlcr_reward")(**args)(response=response, truth=truth)


def test_right_answer_with_confidence_0_8() -> None:
    # format 0.5 * 1; accuracy 0.5 * 1; brier 0.5 * (1 - (1 - 0.8)^2) = 0.5 * 0.96 = 0.48;
    # mean_confidence 1e-5 * 0.8 = 8e-6; 0.8 is neither < 0.01 nor > 0.99 -> 0
    assert parts(reply("4", "0.8")) == pytest.approx(
        {
            "format": 0.5,
            "accuracy": 0.5,
            "brier": 0.48,
            "mean_confidence": 8e-6,
            "confidence_one_or_zero": 0.0,
        }
    )


def test_wrong_answer_is_charged_for_its_confidence() -> None:
    # accuracy 0; brier 0.5 * (1 - (0 - 0.8)^2) = 0.5 * 0.36 = 0.18
    out = parts(reply("5", "0.8"))
    assert out["accuracy"] == 0.0 and out["brier"] == pytest.approx(0.18) and out["format"] == 0.5


def test_certain_and_right_earns_the_extreme_confidence_part() -> None:
    # q 1: brier 0.5 * (1 - 0) = 0.5, mean_confidence 1e-5, confidence_one_or_zero 1e-5 (1 > 0.99)
    out = parts(reply(r"\boxed{4}", "1"))
    assert out["brier"] == 0.5 and out["mean_confidence"] == pytest.approx(1e-5)
    assert out["confidence_one_or_zero"] == pytest.approx(1e-5)


def test_text_after_the_chain_fails_the_format_but_the_confidence_is_still_read() -> None:
    # format, accuracy, brier 0; the last confidence block (0.005) is read: 1e-5 * 0.005, and
    # 0.005 < 0.01 -> confidence_one_or_zero 1e-5
    out = parts(reply("4", "0.005", tail=" Done."))
    assert out["format"] == out["accuracy"] == out["brier"] == 0.0
    assert out["mean_confidence"] == pytest.approx(5e-8) and out["confidence_one_or_zero"] == pytest.approx(
        1e-5
    )


@pytest.mark.parametrize(
    "response",
    [
        "<think><answer>4</answer></think><analysis>a</analysis><confidence>0.5</confidence>",  # nested
        "<think>x</think> so <answer>4</answer><analysis>a</analysis><confidence>0.5</confidence>",  # text between
        "<think>x</think><analysis>a</analysis><answer>4</answer><confidence>0.5</confidence>",  # order
        "<think>x</think><answer>4</answer><analysis>a</analysis><confidence>1.5</confidence>",  # q > 1
        "<think>x</think><answer>4</answer><analysis>a</analysis><confidence>nan</confidence>",
        "<answer>4</answer><analysis>a</analysis><confidence>0.5</confidence>",  # no think
    ],
)
def test_broken_chains_score_no_format_accuracy_or_brier(response: str) -> None:
    out = parts(response)
    assert out["format"] == out["accuracy"] == out["brier"] == 0.0


def test_earlier_balanced_blocks_are_allowed_and_answers_compare_mathematically() -> None:
    # the last eight tags decide; \frac{1}{2} states the truth 0.5 -> accuracy 0.5, brier 0.5 * (1 - 0.5^2) = 0.375
    response = r"<think>a</think><think>b</think><answer>$\frac{1}{2}$</answer><analysis>c</analysis><confidence>0.5</confidence>"
    out = parts(response, truth="0.5")
    assert out["format"] == 0.5 and out["accuracy"] == 0.5 and out["brier"] == pytest.approx(0.375)


def test_no_truth_means_no_accuracy_and_no_brier() -> None:
    out = parts(reply("4", "0.8"), truth=None)
    assert out["format"] == 0.5 and out["accuracy"] == out["brier"] == 0.0


def test_weights_scale_each_part_and_must_name_all_five() -> None:
    weights = {
        "format": 1.0,
        "accuracy": 2.0,
        "brier": 0.0,
        "mean_confidence": 1.0,
        "confidence_one_or_zero": 0.0,
    }
    out = parts(reply("4", "0.8"), weights=weights)
    assert out == pytest.approx(
        {"format": 1.0, "accuracy": 2.0, "brier": 0.0, "mean_confidence": 0.8, "confidence_one_or_zero": 0.0}
    )
    with pytest.raises(InvalidArgument, match="missing \\['brier'\\]") as info:
        RLCRReward(weights={k: v for k, v in weights.items() if k != "brier"})
    assert info.value.field == "reward_fn_args.weights"
    with pytest.raises(InvalidArgument, match="finite number"):
        RLCRReward(weights={**weights, "format": True})


def test_a_parser_and_verifier_replace_the_comparison_and_their_errors_score_zero() -> None:
    reward = RLCRReward(answer_parser=str.strip, verifier=lambda a, b: a.lower() == b.lower())
    assert reward(response=reply(" ABC ", "0.5"), truth="abc")["accuracy"] == 0.5

    def broken(a: str, b: str) -> bool:
        raise RuntimeError("verifier down")

    out = RLCRReward(verifier=broken)(response=reply("4", "0.5"), truth="4")
    assert out["format"] == 0.5 and out["accuracy"] == out["brier"] == 0.0
