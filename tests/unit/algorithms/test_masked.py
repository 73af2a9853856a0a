"""Loss aggregation modes and masked statistics, against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from services.algorithms.masked import aggregate_loss, masked_mean, masked_var, masked_whiten
from services.common.errors import InvalidArgument
from tests.fakes.tensors import close, t

# values [[1, 2, 3], [4, 9, 9]] with mask [[1, 1, 1], [1, 0, 0]]: the 9s are padding.
VALUES = t([1, 2, 3], [4, 9, 9])
MASK = t([1, 1, 1], [1, 0, 0])


def test_token_mean_weighs_every_token_equally():
    # (1 + 2 + 3 + 4) / 4 tokens = 2.5
    assert close(aggregate_loss(VALUES, MASK, "token-mean"), 2.5)


def test_seq_mean_token_sum():
    # row sums 6 and 4, mean over 2 rows = 5
    assert close(aggregate_loss(VALUES, MASK, "seq-mean-token-sum"), 5.0)


def test_seq_mean_token_mean():
    # row means 6/3 = 2 and 4/1 = 4, mean = 3
    assert close(aggregate_loss(VALUES, MASK, "seq-mean-token-mean"), 3.0)


def test_seq_mean_token_sum_norm_divides_by_width():
    # total 10 / T=3 = 3.3333; with normalizer 5: 2.0
    assert close(aggregate_loss(VALUES, MASK, "seq-mean-token-sum-norm"), 10 / 3)
    assert close(aggregate_loss(VALUES, MASK, "seq-mean-token-sum-norm", normalizer=5), 2.0)


def test_unknown_mode_names_key_and_choices():
    with pytest.raises(InvalidArgument) as err:
        aggregate_loss(VALUES, MASK, "token-sum")
    assert err.value.field == "algorithm.loss_agg_mode"
    assert "seq-mean-token-mean" in err.value.message


def test_masked_mean_of_empty_mask_is_zero_not_nan():
    assert masked_mean(VALUES, torch.zeros_like(MASK)).item() == 0.0


def test_masked_var_unbiased_and_whiten():
    # masked values 1, 2, 3, 4: mean 2.5, squared deviations 2.25+0.25+0.25+2.25 = 5, /4 = 1.25 biased,
    # * 4/3 = 1.666667 unbiased. whiten(1) = (1 - 2.5) / sqrt(1.666667) = -1.161895
    assert close(masked_var(VALUES, MASK), 5 / 3)
    assert close(masked_var(VALUES, MASK, unbiased=False), 1.25)
    assert close(masked_whiten(VALUES, MASK)[0, 0], -1.161895)
