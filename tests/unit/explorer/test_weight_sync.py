"""Loading weights into the engines (services/explorer/weight_sync.py): under fully_async with
checkpoint files, a version published while a step generates goes into a transformers engine
between two tokens; the load is reported as a boundary load is, and closes the step's window."""

from __future__ import annotations

import asyncio

import pytest

from services.explorer.engines.base import BatchingEngine, EnginePool, InferenceEngine, SamplingParams
from services.explorer.engines.transformers_engine import TransformersEngine
from services.explorer.mid_step import MidStepWatch, StepLoads
from services.explorer.weight_sync import ServiceWeightSync
from services.models.loading import build_builtin
from services.synchronizer.ledger import Version
from services.synchronizer.plan import Plan
from tests.fakes.explorer import FakeReceiver, FakeSyncClient

EVERY_STEP = Plan(style="fully_async", method="checkpoint", explorer_interval=1)
HOLD_AT, TOKENS = 2, 6


@pytest.fixture
def pool():
    engine = TransformersEngine(
        build_builtin("builtin:tiny-arith", seed=1), eos_token_ids=[2], pad_token_id=0
    )
    made = EnginePool([BatchingEngine(engine, gather_s=0.0)])
    yield made
    made.close()


async def test_a_version_published_mid_generation_loads_between_two_tokens(pool, monkeypatch):
    monkeypatch.setenv("TRINITY_TEST_HOLD_TOKEN", str(HOLD_AT))  # the engine waits there for weights
    client = FakeSyncClient()
    new = {k: v.clone() for k, v in build_builtin("builtin:tiny-arith", seed=2).state_dict().items()}
    weights = ServiceWeightSync(pool, client, FakeReceiver(client, new), EVERY_STEP)
    told: list[int] = []
    loads = weights.during_step(2, told.append)  # E=1: the check before step 2 is due, nothing loaded
    assert isinstance(loads, MidStepWatch)
    params = SamplingParams(n=2, max_tokens=TOKENS, min_tokens=TOKENS, temperature=1.0)
    generating = asyncio.ensure_future(pool[0].generate_async([[5, 6, 7]], params))
    await asyncio.sleep(0.2)
    assert not generating.done()  # held before token HOLD_AT
    client.publish(Version(7, "/ckpt/7"))
    [outputs] = await asyncio.wait_for(generating, 60)
    assert await loads.close() == [7] and told == [7]
    for out in outputs:  # every sequence went on under version 7 from token HOLD_AT
        assert out.token_versions.tolist() == [0] * HOLD_AT + [7] * (TOKENS - HOLD_AT)
    assert client.waited_for == [1] and client.reports == [(7, True)]
    assert pool[0].engine.model_version == 7
    # the load closed step 2's window (the ledger counts 1 step done at it); step 3's check is due
    assert weights.last_sync_step == 1
    assert type(weights.during_step(2, told.append)) is StepLoads
    assert isinstance(later := weights.during_step(3, told.append), MidStepWatch)
    assert await later.close() == []  # nothing newer than 7 was published: the wait is cancelled


async def test_a_boundary_load_stamps_the_engines_version_and_closes_the_window(pool):
    client = FakeSyncClient()
    new = build_builtin("builtin:tiny-arith", seed=2).state_dict()
    weights = ServiceWeightSync(pool, client, FakeReceiver(client, new), EVERY_STEP)
    assert await weights._load(3, Version(4, "/ckpt/4")) == 4
    assert pool[0].engine.model_version == 4 and weights.last_sync_step == 2
    assert type(weights.during_step(3, lambda v: None)) is StepLoads
    [[out]] = await pool[0].generate_async([[5, 6]], SamplingParams(max_tokens=3, temperature=1.0))
    assert set(out.token_versions.tolist()) == {4}


class NoPush(InferenceEngine):
    """An engine that loads weights between batches only (as vLLM's here)."""

    def generate_batch(self, prompts, params):
        return [[] for _ in prompts]

    def update_weights(self, named_tensors):
        pass


@pytest.mark.parametrize(
    "plan",
    [
        Plan(style="fully_async", method="nccl", explorer_interval=1),
        Plan(style="dynamic_by_trainer", method="checkpoint"),
        None,
    ],
)
async def test_no_mid_step_window_under_nccl_other_styles_or_without_a_plan(pool, plan):
    client = FakeSyncClient()
    weights = ServiceWeightSync(pool, client, FakeReceiver(client, {}), plan)
    assert type(weights.during_step(5, lambda v: None)) is StepLoads


async def test_engines_that_cannot_take_weights_mid_batch_load_between_steps_only():
    pool = EnginePool([BatchingEngine(NoPush())])
    client = FakeSyncClient()
    weights = ServiceWeightSync(pool, client, FakeReceiver(client, {}), EVERY_STEP)
    assert not weights.partial and type(weights.during_step(5, lambda v: None)) is StepLoads
    pool.close()
