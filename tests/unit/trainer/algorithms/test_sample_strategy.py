"""Sample strategies: which buffers, how many rows, how stale."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.trainer.algorithms.api import ReadRequest
from services.trainer.algorithms.sample_strategy import (
    DefaultSampleStrategy,
    MixSampleStrategy,
    StalenessControlSampleStrategy,
)


def test_default_reads_the_experience_buffer():
    assert DefaultSampleStrategy().plan(train_batch_size=8, model_version=3) == [ReadRequest("experience", 8)]


def test_staleness_control_bounds_model_version():
    # model_version 4 -> step 5 about to run; max_staleness 2 -> min_model_version = 5 - 2 = 3
    plan = StalenessControlSampleStrategy(max_staleness=2).plan(train_batch_size=8, model_version=4)
    assert plan == [ReadRequest("experience", 8, min_model_version=3)]
    # early steps never ask for a negative version: step 1 - 2 -> 0
    assert (
        StalenessControlSampleStrategy(2).plan(train_batch_size=8, model_version=0)[0].min_model_version == 0
    )
    assert (
        StalenessControlSampleStrategy(2)
        .plan(train_batch_size=8, model_version=0, step=9)[0]
        .min_model_version
        == 7
    )
    with pytest.raises(InvalidArgument):
        StalenessControlSampleStrategy(max_staleness=-1)


def test_mix_splits_expert_rows_with_ceil():
    # N = 10, ratio 0.25 -> expert = ceil(2.5) = 3, usual = 7 (Trinity's rounding)
    plan = MixSampleStrategy(expert_data_ratio=0.25).plan(train_batch_size=10, model_version=0)
    assert plan == [
        ReadRequest("experience", 7),
        ReadRequest("auxiliary", 3, is_expert=True, buffer_name="sft_dataset"),
    ]
    # default ratio 0.5 of 8 -> 4 + 4; ratio 1 -> expert only
    assert MixSampleStrategy().split(8) == (4, 4)
    assert [r.source for r in MixSampleStrategy(1.0).plan(train_batch_size=4, model_version=0)] == [
        "auxiliary"
    ]
    with pytest.raises(InvalidArgument):
        MixSampleStrategy(expert_data_ratio=1.5)
