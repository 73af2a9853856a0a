"""Prometheus metrics of one service process: every RPC by method and status code with its latency,
the process's memory and CPU, and the service's own figures (services/<name>/metrics.py).
`ServiceServer` owns one and serves it at `/metrics` when `services.<name>.metrics_port` is set
(services/common/metrics_http.py; what is exported: docs/metrics.md).

A registry per server, not prometheus_client's global one: the tests run several servers in one
process, and each must expose its own service only. The RPC series are the names
go-grpc-prometheus made common (`grpc_server_handled_total{grpc_service, grpc_method, grpc_type,
grpc_code}`, `grpc_server_handling_seconds`), so existing gRPC dashboards read them. A service's own
gauges are read at scrape time from the state it already keeps (`read_gauges`), or set from the
per-step metrics it already logs (`StepMirror`): nothing is computed twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import grpc
from google.protobuf import descriptor_pool
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from services.common.monitor import Monitor, peak_rss_mb
from services.common.version import __version__

# Seconds; a Read waits up to its max_wait_s and a Heartbeat stream lasts the run: hence the long tail.
RPC_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# Seconds of a trainer or explorer step, or of a weight sync: tiny CPU models to large GPU ones.
STEP_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
RPC_TYPES = {
    (False, False): "unary",
    (False, True): "server_stream",
    (True, False): "client_stream",
    (True, True): "bidi_stream",
}
RPC_LABELS = ("grpc_service", "grpc_method", "grpc_type")
MIB = 1024 * 1024

Samples = Mapping[tuple[str, ...], float]  # label values -> value


def split_method(full_method: str) -> tuple[str, str]:
    """'/trinity_grpc.buffer.v1.BufferService/Write' -> ('trinity_grpc.buffer.v1.BufferService', 'Write')."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service, method


class _ReadAtScrape:
    """A collector whose samples `read()` returns when Prometheus scrapes (on the service's event
    loop: metrics_http.py), so the figure is the service's own state at that moment."""

    def __init__(
        self, kind: str, name: str, doc: str, labels: Sequence[str], read: Callable[[], Samples]
    ) -> None:
        self._family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        self._name, self._doc, self._labels, self._read = name, doc, list(labels), read

    def describe(self) -> Iterable[Metric]:
        return [self._family(self._name, self._doc, labels=self._labels)]

    def collect(self) -> Iterable[Metric]:
        family = self._family(self._name, self._doc, labels=self._labels)
        for values, value in self._read().items():
            family.add_metric(list(values), float(value))
        return [family]


class ServiceMetrics:
    """The instruments of one service process, in a registry of their own (see the module docstring)."""

    def __init__(self, service: str) -> None:
        # No `<name>_created` timestamp series beside every counter and histogram: they would double
        # the page and Prometheus' text format has no use for them (a process-wide switch).
        disable_created_metrics()
        self.service = service
        self.registry = CollectorRegistry()
        # process_resident_memory_bytes, process_cpu_seconds_total, open fds (from /proc: Linux).
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        info = Info("trinity_service", "Which service this process runs.", registry=self.registry)
        info.info({"service": service, "version": __version__})
        self.read_gauges(
            "trinity_process_peak_resident_memory_bytes",
            "Peak resident memory of this process so far (the memory/peak_rss_mb of the step metrics).",
            (),
            lambda: {(): peak_rss_mb() * MIB},
        )
        self._started = Counter(
            "grpc_server_started", "RPCs started on the server.", RPC_LABELS, registry=self.registry
        )
        self._handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, by status code.",
            (*RPC_LABELS, "grpc_code"),
            registry=self.registry,
        )
        self._seconds = Histogram(
            "grpc_server_handling_seconds",
            "Seconds from the start of an RPC to its end (a stream: its whole life).",
            RPC_LABELS,
            buckets=RPC_BUCKETS_S,
            registry=self.registry,
        )

    # ---- RPCs ------------------------------------------------------------------------------------

    def declare(self, full_name: str) -> None:
        """Zero series for every method of the gRPC service `full_name`, so a rate is defined before
        the first call (the started and OK-handled counts, the latency histogram)."""
        for method in descriptor_pool.Default().FindServiceByName(full_name).methods:
            labels = (full_name, method.name, RPC_TYPES[method.client_streaming, method.server_streaming])
            self._started.labels(*labels)
            self._handled.labels(*labels, grpc.StatusCode.OK.name)
            self._seconds.labels(*labels)

    @contextlib.contextmanager
    def rpc(self, full_method: str, rpc_type: str, context: grpc.aio.ServicerContext) -> Iterator[None]:
        """Count one RPC around its handling: started, then handled with the status code the call
        ended with (the one `context` was aborted with, CANCELLED when the caller went away, else OK)."""
        labels = (*split_method(full_method), rpc_type)
        self._started.labels(*labels).inc()
        started = time.perf_counter()
        cancelled = False
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            cancelled = True
            raise
        finally:
            code = grpc.StatusCode.CANCELLED if cancelled else (context.code() or grpc.StatusCode.OK)
            self._handled.labels(*labels, code.name).inc()
            self._seconds.labels(*labels).observe(time.perf_counter() - started)

    # ---- a service's own figures -------------------------------------------------------------------

    def read_gauges(self, name: str, doc: str, labels: Sequence[str], read: Callable[[], Samples]) -> None:
        """A gauge family whose samples `read()` returns at each scrape."""
        self.registry.register(_ReadAtScrape("gauge", name, doc, labels, read))

    def read_counters(self, name: str, doc: str, labels: Sequence[str], read: Callable[[], Samples]) -> None:
        """A counter family (exposed as `<name>_total`) whose samples `read()` returns at each scrape."""
        self.registry.register(_ReadAtScrape("counter", name, doc, labels, read))

    def gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, registry=self.registry)

    def histogram(self, name: str, doc: str, buckets: Sequence[float] = STEP_BUCKETS_S) -> Histogram:
        return Histogram(name, doc, buckets=buckets, registry=self.registry)


@dataclass(frozen=True)
class StepMetric:
    """One figure of the per-step metrics a service logs to its Monitor, exported to Prometheus."""

    key: str
    """Its key in the logged dict, e.g. `time/step`."""
    name: str
    """The Prometheus name, e.g. `trinity_trainer_step_seconds`."""
    doc: str
    histogram: bool = False
    """True: every logged value is observed (a distribution); False: a gauge holds the last one."""


class StepMirror:
    """A Monitor that passes every `log` to `inner` (TensorBoard, wandb, ...) and sets the Prometheus
    instruments of `table` from the same dict, plus `step_gauge` to the step of a dict that carried
    any of them (an eval's dict carries none). The values are those the step computed."""

    def __init__(
        self, inner: Monitor, metrics: ServiceMetrics, table: Sequence[StepMetric], step_gauge: str
    ) -> None:
        self.inner = inner
        self._step = metrics.gauge(step_gauge, "The last step whose metrics were logged.")
        self._table = [
            (m, metrics.histogram(m.name, m.doc) if m.histogram else metrics.gauge(m.name, m.doc))
            for m in table
        ]

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.inner.log(metrics, step)
        seen = False
        for spec, instrument in self._table:
            if spec.key in metrics:
                seen = True
                value = float(metrics[spec.key])
                if isinstance(instrument, Histogram):
                    instrument.observe(value)
                else:
                    instrument.set(value)
        if seen:
            self._step.set(step)

    def close(self) -> None:
        self.inner.close()
