"""Experiences → padded tensors: layout, masks, groups, micro-batch bucketing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.trainer.batching import build_batch, micro_batches
from tests.fakes.trainer import experience

PAD = 0


def test_prompts_left_padded_and_responses_aligned_in_one_column() -> None:
    # Row 0: prompt "ab" (ids 69,70), response "c" (71); row 1: prompt "x" (92), response "yz" (93,94).
    batch = build_batch([experience("ab", "c"), experience("x", "yz")], pad_token_id=PAD)
    inputs = batch.inputs
    assert inputs.prompt_width == 2 and inputs.response_width == 2
    assert inputs.input_ids.tolist() == [[69, 70, 71, PAD], [PAD, 92, 93, 94]]
    assert inputs.attention_mask.tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]
    # Positions count real tokens only, so left padding does not shift the prompt.
    assert inputs.position_ids.tolist() == [[0, 1, 2, 2], [0, 0, 1, 2]]
    assert inputs.responses.tolist() == [[71, PAD], [93, 94]]
    assert batch.train.action_mask.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert inputs.num_tokens == 6


def test_action_mask_logprobs_and_rewards_carried_per_row() -> None:
    exp = experience("q", "abc", reward=0.5)
    exp.action_mask = np.array([True, False, True])
    exp.logprobs = np.array([-0.1, -0.2, -0.3], dtype=np.float32)
    batch = build_batch([exp, experience("q", "a")], pad_token_id=PAD)
    assert batch.train.action_mask[0].tolist() == [1.0, 0.0, 1.0]
    assert batch.train.old_logprob[0].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert batch.needs_logprob.tolist() == [False, True]  # row 1 came without logprobs
    assert batch.train.rewards.tolist() == [0.5, 0.0]


def test_group_index_from_batch_and_task_ids() -> None:
    exps = [
        experience("q", "a", task_id="t1", batch_id=3),
        experience("q", "b", task_id="t2", batch_id=3),
        experience("q", "c", task_id="t1", batch_id=3),
        experience("q", "d", task_id="t1", batch_id=4),  # same task, another explorer step: new group
    ]
    assert build_batch(exps, pad_token_id=PAD).train.group_index.tolist() == [0, 1, 0, 2]


def test_optional_token_arrays_only_when_every_row_has_them() -> None:
    a, b = experience("q", "ab"), experience("q", "c")
    a.advantages = np.array([1.0, 2.0], dtype=np.float32)
    assert build_batch([a, b], pad_token_id=PAD).train.advantages is None
    b.advantages = np.array([3.0], dtype=np.float32)
    assert build_batch([a, b], pad_token_id=PAD).train.advantages.tolist() == [[1.0, 2.0], [3.0, 0.0]]


def test_select_trims_to_the_rows_it_keeps() -> None:
    batch = build_batch([experience("abcd", "e"), experience("x", "y")], pad_token_id=PAD)
    short = batch.select(torch.tensor([1]))
    assert short.inputs.input_ids.tolist() == [[92, 93]]
    assert short.inputs.prompt_width == 1
    assert short.train.action_mask.shape == (1, 1)


def test_micro_batches_bucket_by_length() -> None:
    exps = [experience("q", "a" * n) for n in (5, 1, 4, 2)]
    chunks = micro_batches(build_batch(exps, pad_token_id=PAD), 2)
    assert [c.tolist() for c in chunks] == [[1, 3], [2, 0]]


def test_dpo_rows_expand_to_pairs_that_stay_together() -> None:
    exp = Experience(
        tokens=np.array([5, 6]),
        prompt_length=0,
        model_version=0,
        chosen=np.array([7, 8, 9]),
        rejected=np.array([10]),
    )
    exp2 = Experience(
        tokens=np.array([5]), prompt_length=0, model_version=0, chosen=np.array([7]), rejected=np.array([11])
    )
    batch = build_batch([exp, exp2], pad_token_id=PAD)
    assert batch.train.pair_index.tolist() == [0, 0, 1, 1]
    assert batch.inputs.input_ids[1].tolist() == [5, 6, 10, PAD, PAD]
    chunks = micro_batches(batch, 2)
    assert [c.tolist() for c in chunks] == [[2, 3], [0, 1]]


def test_rejects_rows_longer_than_max_model_len_and_empty_responses() -> None:
    with pytest.raises(InvalidArgument, match="max_model_len"):
        build_batch([experience("abc", "de")], pad_token_id=PAD, max_length=4)
    chat_only = Experience(tokens=np.zeros(0, dtype=np.int64), prompt_length=0, model_version=0)
    with pytest.raises(InvalidArgument) as err:
        build_batch([chat_only], pad_token_id=PAD)
    assert err.value.field == "experiences[0].tokens"
