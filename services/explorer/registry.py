"""One registry pattern for every pluggable part of the explorer (workflows, reward fns, operators).

Built-ins are listed explicitly in one place per registry (`default_mapping`: name -> dotted path,
imported on first use so importing a registry costs nothing). User code comes in three ways, all
through the same `get(name)`:

- a decorator, `@WORKFLOWS.register_module("my_workflow")`, in a module of a plugin directory
  (`explorer.plugin_dirs`) that `load_plugins` imports at start-up;
- a dotted path in the config, `my_pkg.my_module.MyWorkflow` or `my_pkg.my_module:MyWorkflow`;
- `register_module` called from any code imported before the explorer starts.

Names match Trinity-RFT's where a user would carry a config over (`math_workflow`, `reward_filter`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from services.common.errors import InvalidArgument


def import_object(path: str) -> Any:
    """Import `pkg.mod.Name` or `pkg.mod:Name` (the object may be nested: `mod:Outer.Inner`)."""
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ImportError(f"{path!r} is not a dotted path (expected package.module.Name)")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry:
    """Name -> object, with lazily imported built-ins and dotted-path fallback."""

    def __init__(self, kind: str, default_mapping: dict[str, str] | None = None) -> None:
        self.kind = kind
        self._defaults = dict(default_mapping or {})
        self._modules: dict[str, Any] = {}

    def register_module(self, name: str, obj: Any = None, *, force: bool = False) -> Any:
        """Register `obj` under `name`; without `obj`, returns a decorator (Trinity's spelling)."""

        def add(target: Any) -> Any:
            if not force and name in self._modules and self._modules[name] is not target:
                raise InvalidArgument(
                    f"{self.kind} {name!r} is already registered; pick another name", field=name
                )
            self._modules[name] = target
            return target

        return add(obj) if obj is not None else add

    def names(self) -> list[str]:
        return sorted({*self._defaults, *self._modules})

    def builtin_names(self) -> list[str]:
        """The names this project ships (not those registered by plugins or user code)."""
        return sorted(self._defaults)

    def __contains__(self, name: str) -> bool:
        return name in self._modules or name in self._defaults

    def get(self, name: str, *, field: str = "") -> Any:
        """The object registered as `name`, a built-in, or the object at dotted path `name`."""
        if name in self._modules:
            return self._modules[name]
        if name in self._defaults:
            obj = import_object(self._defaults[name])
            self._modules.setdefault(name, obj)
            return self._modules[name]
        if "." in name or ":" in name:
            try:
                return import_object(name)
            except (ImportError, AttributeError) as exc:
                raise InvalidArgument(f"cannot import {self.kind} {name!r}: {exc}", field=field) from exc
        raise InvalidArgument(
            f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())} "
            "(or give a dotted path, or put a module that registers it in explorer.plugin_dirs)",
            field=field,
        )


_loaded_plugin_files: set[str] = set()


def load_plugins(dirs: list[str]) -> list[str]:
    """Import every `*.py` (not starting with `_`) of each plugin directory once; returns the modules loaded.

    Modules register themselves with the decorators above when imported. The directory is put on
    sys.path so plugin modules can import each other.
    """
    loaded: list[str] = []
    for directory in dirs:
        directory = os.path.abspath(directory)
        if not os.path.isdir(directory):
            raise InvalidArgument(
                f"plugin directory {directory} does not exist", field="explorer.plugin_dirs"
            )
        if directory not in sys.path:
            sys.path.insert(0, directory)
        for filename in sorted(os.listdir(directory)):
            path = os.path.join(directory, filename)
            if not filename.endswith(".py") or filename.startswith("_") or path in _loaded_plugin_files:
                continue
            module_name = f"trinity_plugin_{filename[:-3]}"
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
            _loaded_plugin_files.add(path)
            loaded.append(module_name)
    return loaded


Factory = Callable[..., Any]
