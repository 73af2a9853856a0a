"""`trinity debug`'s view of an experience: mask runs, the JSON record, the text lines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from services.cli.debug_format import experience_record, mask_runs, render_summary, render_text
from services.common.experience import ChatMessage, Experience


def decode(ids: list[int]) -> str:
    """A stand-in tokenizer: id i is the letter chr(96 + i) (1 -> a), 0 is <eos>."""
    return "".join("<eos>" if i == 0 else chr(96 + i) for i in ids)


def multi_turn() -> Experience:
    # prompt "ab" (2 tokens); response: the model's "cd", the environment's "ef", the model's "g<eos>"
    return Experience(
        tokens=np.array([1, 2, 3, 4, 5, 6, 7, 0]),
        prompt_length=2,
        model_version=3,
        reward=1.5,
        logprobs=np.array([-1.0, -3.0, 0.0, 0.0, -0.5, -0.5], dtype=np.float32),
        action_mask=np.array([1, 1, 0, 0, 1, 1], dtype=bool),
        task_id="t7",
        run_id=2,
        metrics={"accuracy": 1.0, "format": 0.5},
        info={"finish_reason": "stop", "ids": np.arange(3), "long": "x" * 300},
        messages=[ChatMessage("user", "ab\n"), ChatMessage("assistant", "cd")],
    )


@pytest.mark.parametrize(
    ("mask", "runs"),
    [
        ([], []),
        ([1, 1, 1], [(True, 0, 3)]),
        ([0], [(False, 0, 1)]),
        ([1, 1, 0, 0, 1], [(True, 0, 2), (False, 2, 4), (True, 4, 5)]),
        ([0, 1, 0], [(False, 0, 1), (True, 1, 2), (False, 2, 3)]),
    ],
)
def test_mask_runs_cut_the_response_into_maximal_runs(mask, runs):
    assert mask_runs(np.array(mask, dtype=bool)) == runs


def test_the_record_splits_prompt_and_response_and_counts_trained_tokens():
    record = experience_record(multi_turn(), task_index=4, decode=decode)
    assert record["tokens"] == {"prompt": 2, "response": 6, "trained": 4}
    assert record["prompt_ids"] == [1, 2] and record["prompt_decoded"] == "ab"
    assert record["response_ids"] == [3, 4, 5, 6, 7, 0]
    assert record["action_mask"] == [1, 1, 0, 0, 1, 1]
    assert record["mask_runs"] == [
        {"trained": True, "tokens": 2, "text": "cd"},
        {"trained": False, "tokens": 2, "text": "ef"},
        {"trained": True, "tokens": 2, "text": "g<eos>"},
    ]
    assert record["task_index"] == 4 and record["task_id"] == "t7" and record["run_id"] == 2
    assert record["reward"] == 1.5 and record["metrics"] == {"accuracy": 1.0, "format": 0.5}
    assert record["messages"] == [{"role": "user", "content": "ab\n"}, {"role": "assistant", "content": "cd"}]
    assert record["info"]["ids"] == [0, 1, 2]  # numpy made JSON-ready
    json.dumps(record)  # the whole record serialises


def test_a_missing_action_mask_means_every_response_token_is_trained():
    exp = Experience(tokens=np.array([1, 2, 3]), prompt_length=1, model_version=0)
    record = experience_record(exp, task_index=0, decode=decode)
    assert record["tokens"] == {"prompt": 1, "response": 2, "trained": 2}
    assert record["mask_runs"] == [{"trained": True, "tokens": 2, "text": "bc"}]
    assert record["logprobs"] is None and record["reward"] is None


def test_the_text_view_marks_trained_runs_and_averages_logprobs_over_trained_tokens_only():
    lines = render_text(experience_record(multi_turn(), task_index=4, decode=decode), number=2, total=5)
    text = "\n".join(lines)
    assert lines[0] == ""
    assert lines[1] == "=== experience 2/5: task 4 (id t7), run 2, step 0, model version 3 ==="
    assert '  [user] "ab\\n"' in lines and '  [assistant] "cd"' in lines
    assert 'prompt: 2 tokens: "ab"' in lines
    assert "response: 6 tokens, 4 trained (action mask: + trained, - not trained)" in lines
    runs = lines[lines.index("response: 6 tokens, 4 trained (action mask: + trained, - not trained)") + 1 :][
        :3
    ]
    assert runs == ['  + "cd"', '  - "ef"', '  + "g<eos>"']
    # trained logprobs -1, -3, -0.5, -0.5: mean -5 / 4 = -1.25, min -3 (the environment's zeros left out)
    assert "logprobs of the trained tokens: mean -1.2500, min -3.0000" in lines
    assert "reward: 1.5" in lines
    assert "metrics (reward parts and workflow metrics): accuracy=1, format=0.5" in lines
    assert 'finish_reason="stop"' in text and "... (302 chars)" in text  # long info values are cut


def test_the_summary_counts_experiences_their_mean_reward_and_failures():
    records = [{"reward": 1.0}, {"reward": 0.0}, {"reward": None}]
    assert render_summary(records, []) == "3 experiences, mean reward 0.5000"
    assert render_summary([], [{}]) == "0 experiences, 1 failed (tracebacks on stderr)"
