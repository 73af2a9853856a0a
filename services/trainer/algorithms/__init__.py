"""Algorithm library: advantage fns, policy losses, KL, entropy, loss aggregation, sample strategies.

Public surface for the training loop: `build_algorithm(cfg) -> Algorithm`, `TrainBatch`, `ReadRequest`
(see api.py for the contract). Pure torch; no grpc.
"""

from __future__ import annotations

from services.trainer.algorithms.api import Algorithm, ReadRequest, SampleStrategy, TrainBatch
from services.trainer.algorithms.builder import build_algorithm

__all__ = ["Algorithm", "ReadRequest", "SampleStrategy", "TrainBatch", "build_algorithm"]
