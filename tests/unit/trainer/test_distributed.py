"""distributed.LeaderEngine: reads and writes reach rank 0's engine (collective calls are covered by
tests/integration/test_trainer_fsdp.py under torchrun)."""

from __future__ import annotations

import torch

from services.trainer.distributed import DistContext, LeaderEngine


class Engine:
    """Pure stand-in: a step counter and a non-collective method."""

    def __init__(self) -> None:
        self.step = 3

    def describe(self) -> str:
        return f"step {self.step}"


def test_a_write_through_the_leader_reaches_the_engine() -> None:
    engine = Engine()
    leader = LeaderEngine(engine, DistContext(0, 2, torch.device("cpu")))
    leader.step = 7  # TrainerLoop moves the step past updates lost in a crash
    assert engine.step == 7 and leader.step == 7
    assert leader.describe() == "step 7"
