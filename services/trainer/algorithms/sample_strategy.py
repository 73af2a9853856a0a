"""Sample strategies: which buffer(s) a training step reads, how many rows, and how stale they may be.

The loop calls `plan(train_batch_size=N, model_version=v)` once per step and makes one read per
ReadRequest (see api.py). Names and arguments follow Trinity-RFT's `algorithm.sample_strategy`:

    default            read N rows from the experience buffer.
    staleness_control  same, but skip rows older than min_model_version = max(step - max_staleness, 0),
                       step = the training step about to run (= v + 1). Trinity: max_staleness.
    mix                read N - ceil(r * N) rows from the experience buffer and ceil(r * N) expert rows
                       from auxiliary buffer `sft_dataset_name` (r = expert_data_ratio, default 0.5).
"""

from __future__ import annotations

import math

from services.common.errors import InvalidArgument
from services.trainer.algorithms.api import ReadRequest, SampleStrategy


class DefaultSampleStrategy(SampleStrategy):
    name = "default"

    def plan(
        self, *, train_batch_size: int, model_version: int, step: int | None = None
    ) -> list[ReadRequest]:
        return [ReadRequest(source="experience", batch_size=train_batch_size)]


class StalenessControlSampleStrategy(SampleStrategy):
    name = "staleness_control"

    def __init__(self, max_staleness: int = 1) -> None:
        if not isinstance(max_staleness, int) or max_staleness < 0:
            raise InvalidArgument(
                f"max_staleness must be an integer >= 0, got {max_staleness!r}",
                field="algorithm.sample_strategy_args.max_staleness",
            )
        self.max_staleness = max_staleness

    def plan(
        self, *, train_batch_size: int, model_version: int, step: int | None = None
    ) -> list[ReadRequest]:
        step = model_version + 1 if step is None else step
        return [
            ReadRequest(
                source="experience",
                batch_size=train_batch_size,
                min_model_version=max(step - self.max_staleness, 0),
            )
        ]


class MixSampleStrategy(SampleStrategy):
    name = "mix"

    def __init__(self, expert_data_ratio: float = 0.5, sft_dataset_name: str = "sft_dataset") -> None:
        if not 0.0 <= expert_data_ratio <= 1.0:
            raise InvalidArgument(
                f"expert_data_ratio must be in [0, 1], got {expert_data_ratio}",
                field="algorithm.sample_strategy_args.expert_data_ratio",
            )
        self.expert_data_ratio = expert_data_ratio
        self.sft_dataset_name = sft_dataset_name

    def split(self, train_batch_size: int) -> tuple[int, int]:
        """(usual rows, expert rows); expert = ceil(ratio * N) as in Trinity."""
        expert = math.ceil(self.expert_data_ratio * train_batch_size)
        return train_batch_size - expert, expert

    def plan(
        self, *, train_batch_size: int, model_version: int, step: int | None = None
    ) -> list[ReadRequest]:
        usual, expert = self.split(train_batch_size)
        requests = []
        if usual:
            requests.append(ReadRequest(source="experience", batch_size=usual))
        if expert:
            requests.append(
                ReadRequest(
                    source="auxiliary", batch_size=expert, is_expert=True, buffer_name=self.sft_dataset_name
                )
            )
        return requests
