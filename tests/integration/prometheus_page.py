"""A /metrics page read with prometheus_client's own parser, as a Prometheus scrape reads it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(page: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, its labels) -> value of every sample on the page (the parser fails on a bad page)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


def value(page: str | dict, name: str, **labels: str) -> float | None:
    """The value of sample `name` with exactly these labels; None when the page has no such sample."""
    found = page if isinstance(page, dict) else samples(page)
    return found.get((name, frozenset(labels.items())))


def families(page: str) -> set[str]:
    """The metric family names on the page (a counter's without `_total`)."""
    return {family.name for family in text_string_to_metric_families(page)}
