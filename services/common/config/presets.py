"""algorithm_type presets (the table is data: presets.yaml beside this file), applied at load.

`AlgorithmConfig` calls `apply_preset` on its raw input, so every AlgorithmConfig in every process —
the loader's, a stage's, `trinity config check`'s, one a test builds — has all its parts named:
user's value > the algorithm_type's preset > the global fallback. Nothing downstream re-derives them.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

PRESETS_FILE = "presets.yaml"


@functools.cache
def _table() -> dict[str, Any]:
    text = (resources.files("services.common.config") / PRESETS_FILE).read_text(encoding="utf-8")
    table = yaml.safe_load(text)
    assert isinstance(table, dict) and {"fallback", "presets"} <= set(table), PRESETS_FILE
    return table


def algorithm_types() -> list[str]:
    """Every algorithm_type with a preset, sorted."""
    return sorted(_table()["presets"])


def preset(algorithm_type: str) -> dict[str, Any]:
    """The values `algorithm_type` gives the keys a user leaves unset (fallbacks included)."""
    table = _table()
    return {**table["fallback"], **table["presets"][algorithm_type]}


def apply_preset(raw: dict[str, Any], default_type: str) -> dict[str, Any]:
    """`raw` (an `algorithm:` mapping) with every unset or null preset key filled; an unknown
    algorithm_type is left for the field's own check, which names the allowed values."""
    algorithm_type = raw.get("algorithm_type") or default_type
    if not isinstance(algorithm_type, str) or algorithm_type not in _table()["presets"]:
        return raw
    filled = dict(raw)
    for key, value in preset(algorithm_type).items():
        if filled.get(key) is None:
            filled[key] = value
    return filled
