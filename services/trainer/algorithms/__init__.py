"""The trainer's algorithm library: policy losses, KL, entropy, value loss, sample strategies, and
the composite algorithm that joins them to the advantage fns of services/algorithms.

Public surface for the training loop: `build_algorithm(cfg) -> Algorithm`, `ReadRequest` (see
api.py for the contract; the batch type is services.algorithms.batch.TrainBatch). Pure torch; no grpc.
"""

from __future__ import annotations

from services.trainer.algorithms.api import Algorithm, ReadRequest, SampleStrategy
from services.trainer.algorithms.builder import build_algorithm

__all__ = ["Algorithm", "ReadRequest", "SampleStrategy", "build_algorithm"]
