"""The instruments of a service process: per-method zero series, figures read at scrape time, the
step metrics mirrored from the monitor (checked against hand-worked histogram buckets), and the
exposition parsed back by prometheus_client's own parser. RPC counting through a real server:
tests/integration/test_metrics.py."""

from __future__ import annotations

import pathlib

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from services.common.metrics import ServiceMetrics, StepMetric, StepMirror, split_method
from services.common.monitor import TensorBoardMonitor
from trinity_grpc.buffer.v1 import buffer_pb2  # noqa: F401 - registers BufferService's descriptor
from trinity_grpc.synchronizer.v1 import synchronizer_pb2  # noqa: F401 - and SynchronizerService's

BUFFER = "trinity_grpc.buffer.v1.BufferService"
SYNC = "trinity_grpc.synchronizer.v1.SynchronizerService"


def test_split_method_separates_the_service_and_the_method() -> None:
    assert split_method(f"/{BUFFER}/Write") == (BUFFER, "Write")


def test_declare_gives_every_method_zero_series_with_its_streaming_type() -> None:
    metrics = ServiceMetrics("buffer")
    metrics.declare(BUFFER)
    metrics.declare(SYNC)
    get = metrics.registry.get_sample_value
    labels = {"grpc_service": BUFFER, "grpc_method": "Write", "grpc_type": "unary"}
    assert get("grpc_server_started_total", labels) == 0.0
    assert get("grpc_server_handled_total", {**labels, "grpc_code": "OK"}) == 0.0
    assert get("grpc_server_handling_seconds_count", labels) == 0.0
    stream = {"grpc_service": BUFFER, "grpc_method": "StreamRead", "grpc_type": "server_stream"}
    assert get("grpc_server_started_total", stream) == 0.0
    beats = {"grpc_service": SYNC, "grpc_method": "Heartbeat", "grpc_type": "bidi_stream"}
    assert get("grpc_server_started_total", beats) == 0.0
    page = generate_latest(metrics.registry).decode()
    declared = {
        s.labels["grpc_method"]
        for f in text_string_to_metric_families(page)
        if f.name == "grpc_server_started"
        for s in f.samples
        if s.labels["grpc_service"] == BUFFER
    }
    assert declared == {m.name for m in buffer_pb2.DESCRIPTOR.services_by_name["BufferService"].methods}


def test_read_at_scrape_families_show_the_state_of_each_scrape() -> None:
    metrics = ServiceMetrics("buffer")
    depth = {"exp": 3.0}
    events = {"written": 5.0}
    metrics.read_gauges("t_depth", "depth", ("buffer",), lambda: {(k,): v for k, v in depth.items()})
    metrics.read_counters("t_rows", "rows", ("event",), lambda: {(k,): v for k, v in events.items()})
    get = metrics.registry.get_sample_value
    assert get("t_depth", {"buffer": "exp"}) == 3.0 and get("t_rows_total", {"event": "written"}) == 5.0
    depth.update(exp=1.0, other=7.0)
    events["written"] = 9.0
    assert get("t_depth", {"buffer": "exp"}) == 1.0 and get("t_depth", {"buffer": "other"}) == 7.0
    assert get("t_rows_total", {"event": "written"}) == 9.0


def test_a_family_name_can_be_registered_once() -> None:
    metrics = ServiceMetrics("buffer")
    metrics.read_gauges("t_depth", "depth", (), lambda: {(): 1.0})
    with pytest.raises(ValueError, match="t_depth"):
        metrics.read_gauges("t_depth", "again", (), lambda: {(): 2.0})


def test_process_memory_and_the_service_name_are_exported() -> None:
    metrics = ServiceMetrics("trainer")
    get = metrics.registry.get_sample_value
    rss = get("process_resident_memory_bytes")
    assert rss is not None and rss > 1024 * 1024  # /proc/self/stat of this Python process
    peak = get("trinity_process_peak_resident_memory_bytes")
    assert peak is not None and peak >= rss * 0.5  # ru_maxrss: the peak so far, never far below RSS
    assert get("trinity_service_info", {"service": "trainer", "version": "0.1.0"}) == 1.0


TABLE = (
    StepMetric("time/step", "t_step_seconds", "step time", histogram=True),
    StepMetric("perf/tokens_per_s", "t_tokens_per_second", "tokens/s"),
)


def test_step_mirror_sets_gauges_observes_histograms_and_passes_everything_on(tmp_path: pathlib.Path) -> None:
    metrics = ServiceMetrics("trainer")
    mirror = StepMirror(TensorBoardMonitor(str(tmp_path / "tb")), metrics, TABLE, "t_step")
    mirror.log({"time/step": 0.2, "perf/tokens_per_s": 100.0, "actor/loss": 0.5}, step=1)
    mirror.log({"time/step": 0.6, "perf/tokens_per_s": 300.0}, step=2)
    mirror.log({"eval/accuracy": 0.75}, step=3)  # an eval's dict: none of the table's keys
    mirror.close()
    get = metrics.registry.get_sample_value
    # observed 0.2 and 0.6: bucket le=0.1 holds none, le=0.25 one, le=0.5 one, le=1 both; sum 0.8
    assert get("t_step_seconds_bucket", {"le": "0.1"}) == 0.0
    assert get("t_step_seconds_bucket", {"le": "0.25"}) == 1.0
    assert get("t_step_seconds_bucket", {"le": "0.5"}) == 1.0
    assert get("t_step_seconds_bucket", {"le": "1.0"}) == 2.0
    assert get("t_step_seconds_count") == 2.0 and get("t_step_seconds_sum") == pytest.approx(0.8)
    assert get("t_tokens_per_second") == 300.0  # a gauge keeps the last value
    assert get("t_step") == 2.0  # step 3 carried none of the table's keys
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("actor/loss")] == [(1, 0.5)]
    assert [(e.step, e.value) for e in acc.Scalars("eval/accuracy")] == [(3, 0.75)]
