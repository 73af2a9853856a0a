"""Weights pushed while an engine generates (services/explorer/engines/weight_pushes.py): loaded in
push order at the next boundary, each stamping its version; a failed load fails its push and the
later ones, so no pusher waits forever."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.explorer.engines.weight_pushes import WeightPushes
from tests.fakes.llm_engine import FakeHost, FakeLLMEngine


def test_pushes_load_in_order_and_the_engine_takes_the_last_version() -> None:
    host = FakeHost(FakeLLMEngine())
    pushes = WeightPushes()
    assert not pushes.pending and pushes.apply(host) is False
    first, second = pushes.push(3, [("w", 30)]), pushes.push(5, iter([("w", 50)]))
    assert pushes.pending and not first.is_set()
    assert pushes.apply(host) is True
    assert host.engine.weights == 50 and host.model_version == 5
    for push in (first, second):
        assert push.is_set() and push.error is None and push.tensors == []  # the tensors are let go
    assert not pushes.pending and pushes.apply(host) is False


def test_a_failed_load_fails_its_push_and_the_later_ones_and_keeps_the_earlier() -> None:
    host = FakeHost(FakeLLMEngine())
    refused = InvalidArgument("weight 'w' has the wrong shape", field="weights")
    host.refuse[50] = refused
    pushes = WeightPushes()
    ok, bad, after = (pushes.push(v, [("w", 10 * v)]) for v in (3, 5, 6))
    with pytest.raises(InvalidArgument):
        pushes.apply(host)
    assert ok.error is None and bad.error is refused and after.error is refused
    assert all(p.is_set() for p in (ok, bad, after))
    assert host.engine.weights == 30 and host.model_version == 3 and not pushes.pending
