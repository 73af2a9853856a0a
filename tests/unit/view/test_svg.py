"""Inline SVG charts: round ticks, points placed by hand-derived coordinates, an empty state."""

from __future__ import annotations

import re

from services.view.svg import BOTTOM, HEIGHT, LEFT, RIGHT, TOP, WIDTH, Series, _ticks, line_chart


def test_ticks_are_round_and_cover_the_range() -> None:
    assert _ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert _ticks(3.0, 27.0) == [5.0, 10.0, 15.0, 20.0, 25.0]
    assert _ticks(2.0, 2.0) == [2.0]


def test_points_are_scaled_into_the_plot_area() -> None:
    svg = line_chart(
        "r", [Series("a", [(0.0, 0.0), (10.0, 1.0)])], x_label="x", y_label="y", y_range=(0.0, 1.0)
    )
    points = re.search(r'<polyline points="([^"]+)"', svg).group(1).split()
    # x 0 -> LEFT, x 10 -> WIDTH - RIGHT; y 0 -> HEIGHT - BOTTOM, y 1 -> TOP
    assert points == [f"{LEFT:.1f},{HEIGHT - BOTTOM:.1f}", f"{WIDTH - RIGHT:.1f},{TOP:.1f}"]
    assert svg.count("<circle") == 2 and ">a<" in svg


def test_no_points_says_so_and_text_is_escaped() -> None:
    svg = line_chart("<title>", [Series("s", [])], x_label="x", y_label="y")
    assert "no data yet" in svg and "<polyline" not in svg
    assert "&lt;title&gt;" in svg
