"""The /metrics responder: routes, methods, malformed requests, and the format Prometheus asks for
(the text format by default, OpenMetrics when its Accept header prefers it). Over a real socket:
tests/integration/test_metrics.py."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from services.common.metrics_http import respond

# What Prometheus 3 sends (scrape_protocols' default order).
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("t_calls", "calls", registry=reg).inc(3)
    return reg


def test_get_metrics_answers_the_text_format_by_default() -> None:
    status, content_type, body = respond(b"GET /metrics HTTP/1.1\r\nHost: x", registry())
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    (family,) = text_string_to_metric_families(body.decode())
    assert (family.name, family.samples[0].name, family.samples[0].value) == ("t_calls", "t_calls_total", 3.0)


def test_openmetrics_when_the_scraper_prefers_it_and_a_query_string_is_ignored() -> None:
    head = f"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\naccept: {PROMETHEUS_ACCEPT}".encode()
    status, content_type, body = respond(head, registry())
    assert status == 200 and content_type.startswith("application/openmetrics-text")
    assert body.decode().endswith("# EOF\n")
    (family,) = openmetrics_families(body.decode())
    assert family.samples[0].value == 3.0


def test_other_paths_methods_and_garbage_get_an_http_error() -> None:
    assert respond(b"GET / HTTP/1.1", registry())[:2] == (404, "text/plain")
    assert respond(b"GET /metricsx HTTP/1.1", registry())[0] == 404
    assert respond(b"POST /metrics HTTP/1.1\r\nContent-Length: 0", registry())[0] == 405
    assert respond(b"\x16\x03\x01 hello", registry())[0] == 400  # e.g. a TLS client hello
    assert respond(b"GET /metrics", registry())[0] == 400
