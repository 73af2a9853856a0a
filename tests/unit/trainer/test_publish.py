"""SynchronizerSink: obeys the synchronizer's plan, never re-publishes a version it had before a restart."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.trainer.publish import SynchronizerSink
from tests.fakes.trainer import NllAlgorithm, tiny_model


@dataclass
class FakeSync:
    publish_at: set[int]
    calls: list[str] = field(default_factory=list)

    async def begin_trainer_step(self, step: int) -> bool:
        self.calls.append(f"begin {step}")
        return step in self.publish_at

    async def end_trainer_step(self, step: int) -> bool:
        self.calls.append(f"end {step}")
        return step in self.publish_at

    async def close(self) -> None:
        self.calls.append("close")


@dataclass
class FakePublisher:
    published: list[tuple[int, int, str]] = field(default_factory=list)
    colocated: bool = False

    async def publish(self, state_dict, step, *, config=None):
        self.published.append((step, len(state_dict), config["model_type"]))


async def test_publishes_full_weights_when_the_plan_says_and_skips_versions_already_published() -> None:
    from services.trainer.engine import TrainEngine
    from services.trainer.settings import EngineSettings

    engine = TrainEngine(tiny_model(), NllAlgorithm(), EngineSettings())
    sync, publisher = FakeSync(publish_at={2, 4, 6}), FakePublisher()
    sink = SynchronizerSink(sync, publisher, latest_version=4)  # restarted after publishing version 4
    done = []
    for step in range(1, 7):
        await sink.begin_step(step)
        done.append(await sink.end_step(step, engine))
    await sink.close()
    assert done == [False, False, False, False, False, True]
    n_tensors = len(engine.model.state_dict())
    assert publisher.published == [(6, n_tensors, "gpt2")]
    assert sync.calls[:2] == ["begin 1", "end 1"] and sync.calls[-1] == "close"
    assert sink.latest_version == 6


async def test_resumed_weights_are_published_once_when_the_ledger_lacks_them() -> None:
    """A whole-run restart: the synchronizer's ledger is empty, the trainer resumed at step 22."""
    from services.trainer.engine import TrainEngine
    from services.trainer.settings import EngineSettings

    engine = TrainEngine(tiny_model(), NllAlgorithm(), EngineSettings())
    publisher = FakePublisher()
    fresh = SynchronizerSink(FakeSync(publish_at=set()), publisher, latest_version=0)
    assert await fresh.publish_resumed(22, engine) is True
    assert await fresh.publish_resumed(22, engine) is False  # once
    known = SynchronizerSink(FakeSync(publish_at=set()), publisher, latest_version=22)
    assert await known.publish_resumed(22, engine) is False  # the ledger has it already
    assert [p[0] for p in publisher.published] == [22] and fresh.latest_version == 22
