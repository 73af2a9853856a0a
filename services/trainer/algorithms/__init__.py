"""Algorithm library: advantage fns, policy losses, KL, entropy, loss aggregation, sample strategies.

Public surface for the training loop: `build_algorithm(cfg) -> Algorithm`, `TrainBatch`, `ReadRequest`
(see api.py for the contract). Pure torch; no grpc.
"""

from __future__ import annotations

from services.trainer.algorithms.api import Algorithm, ReadRequest, SampleStrategy, TrainBatch

__all__ = ["Algorithm", "ReadRequest", "SampleStrategy", "TrainBatch", "build_algorithm"]


def build_algorithm(cfg):  # noqa: ANN001, ANN201 - thin lazy forwarder keeps import order simple
    """Compose the algorithm named by `cfg.algorithm_type` (an AlgorithmConfig); see builder.py."""
    from services.trainer.algorithms.builder import build_algorithm as _build

    return _build(cfg)
