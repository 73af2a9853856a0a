"""One registry pattern for every pluggable algorithm part.

Built-ins are listed explicitly, in one place per kind (see `parts.py`); a user part is named by a
dotted path "pkg.module:fn". An unknown name raises InvalidArgument naming the config key and
listing the allowed values, so a typo in YAML fails at start-up, not mid-training.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from services.common.errors import InvalidArgument


class Registry:
    """Name -> callable, for one kind of part (e.g. `algorithm.advantage_fn`)."""

    def __init__(self, config_key: str, builtins: Mapping[str, Callable[..., Any]]) -> None:
        self.config_key = config_key
        self._builtins = dict(builtins)

    @property
    def names(self) -> list[str]:
        return sorted(self._builtins)

    def get(self, name: str) -> Callable[..., Any]:
        """The built-in called `name`, or the object at dotted path "pkg.module:attr"."""
        if name in self._builtins:
            return self._builtins[name]
        if ":" in name:
            return _import_dotted(name, self.config_key)
        raise InvalidArgument(
            f"unknown {self.config_key.rsplit('.', 1)[-1]} {name!r}; allowed: {', '.join(self.names)}"
            ' or a dotted path "pkg.module:fn"',
            field=self.config_key,
        )


def _import_dotted(path: str, config_key: str) -> Callable[..., Any]:
    module_name, _, attr = path.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"cannot import {path!r}: {exc}", field=config_key) from exc
    if not callable(obj):
        raise InvalidArgument(f"{path!r} is not callable", field=config_key)
    return obj


def check_args(fn: Callable[..., Any], args: Mapping[str, Any], config_key: str, skip: int = 0) -> None:
    """Reject keyword args `fn` does not accept (a misspelt `clip_range` must not be ignored).

    `skip`: leading positional parameters filled by the caller (tensors, the batch).
    """
    params = list(inspect.signature(fn).parameters.values())[skip:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    allowed = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise InvalidArgument(
            f"unknown argument(s) {unknown}; allowed: {sorted(allowed)}",
            field=config_key,
        )
