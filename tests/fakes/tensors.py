"""Small builders shared by the algorithm tests."""

from __future__ import annotations

import torch

from services.algorithms.batch import TrainBatch


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def make_batch(b: int = 2, width: int = 3, **fields: object) -> TrainBatch:
    """A TrainBatch of ones-mask / zero-logprob rows; override any field by keyword."""
    base = {
        "action_mask": torch.ones(b, width),
        "old_logprob": torch.zeros(b, width),
        "rewards": torch.zeros(b),
        "group_index": torch.zeros(b, dtype=torch.long),
        "model_version": torch.zeros(b, dtype=torch.long),
    }
    base.update(fields)
    return TrainBatch(**base)  # type: ignore[arg-type]


def close(actual: object, expected: object, atol: float = 1e-5) -> bool:
    a = torch.as_tensor(actual, dtype=torch.float32)
    e = torch.as_tensor(expected, dtype=torch.float32)
    return a.shape == e.shape and bool(torch.allclose(a, e, atol=atol))
