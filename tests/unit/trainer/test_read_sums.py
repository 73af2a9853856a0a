"""modeling.read_sums: the step's loss sums, kept as device tensors through the micro-batches, read
as floats once at the end; floats pass through unchanged."""

from __future__ import annotations

import pytest
import torch

from services.trainer.modeling import read_sums


def test_tensors_and_floats_come_back_as_floats() -> None:
    sums = {
        "loss": torch.tensor(0.25) + torch.tensor(0.5),
        "kl_coef": 0.1,
        "pg_clipfrac": torch.tensor([0.125]),
    }
    out = read_sums(sums)
    assert out == {"kl_coef": 0.1, "loss": 0.75, "pg_clipfrac": 0.125}
    assert all(type(v) is float for v in out.values())


def test_mixed_dtypes_are_read_together() -> None:
    out = read_sums({"a": torch.tensor(3, dtype=torch.int64), "b": torch.tensor(1.5, dtype=torch.bfloat16)})
    assert out == {"a": 3.0, "b": 1.5}


def test_no_sums() -> None:
    assert read_sums({}) == {}
    assert read_sums({"loss": 0.0}) == {"loss": 0.0}


def test_a_non_scalar_tensor_is_refused() -> None:
    with pytest.raises(RuntimeError):
        read_sums({"bad": torch.ones(2)})
