"""One registry pattern for every pluggable part: workflows, reward fns, operators, environments, and
each algorithm part (advantage fns, policy losses, KL, entropy, sample strategies).

Built-ins are listed explicitly, in one place per registry, as name -> "pkg.module:attr", and are
imported on first use, so importing a registry costs nothing (the explorer never pays for the
trainer's parts, `trinity --help` for any). User code comes in through the same `get(name)`:

- a dotted path in the config, `my_pkg.my_module:MyPart` or `my_pkg.my_module.MyPart` (a registry's
  aliases map the dotted paths of Trinity's own classes, which are not importable here, to built-ins);
- `@REGISTRY.register_module("my_part")` in a module imported before the part is looked up (for
  the explorer, a module of a plugin directory in `explorer.plugin_dirs`, see
  services/explorer/plugins.py).

An unknown name raises InvalidArgument naming the config key and listing the allowed names, so a
typo in YAML fails at start-up, not mid-run. Names match Trinity-RFT's where a user would carry a
config over (`math_workflow`, `reward_filter`, `grpo`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from services.common.errors import InvalidArgument


def import_object(path: str) -> Any:
    """Import `pkg.mod:Name` or `pkg.mod.Name` (the object may be nested: `pkg.mod:Outer.Inner`)."""
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ImportError(f"{path!r} is not a dotted path (expected package.module:Name)")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry:
    """Name -> object for one kind of part, built-ins imported on first use.

    kind: what the user reads in errors ("workflow", "advantage_fn"); config_key: the config key the
    name comes from, reported as the error's `field` (a caller with a more precise key, such as
    `operators[2].name`, passes it to `get`); plugin_hint: where else a registering module may live.
    """

    def __init__(
        self,
        kind: str,
        builtins: Mapping[str, str],
        *,
        config_key: str = "",
        plugin_hint: str = "",
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.config_key = config_key
        self.plugin_hint = plugin_hint
        self._builtins = dict(builtins)
        self._aliases = dict(aliases or {})  # another spelling (Trinity's dotted path) -> a built-in name
        self._loaded: dict[str, Any] = {}
        self._registered: dict[str, Any] = {}

    def register_module(self, name: str, obj: Any = None, *, force: bool = False) -> Any:
        """Register `obj` under `name`; without `obj`, returns a decorator (Trinity's spelling).

        A name already registered to another object is refused unless force=True; a registered name
        shadows a built-in of the same name.
        """

        def add(target: Any) -> Any:
            if not force and self._registered.get(name, target) is not target:
                raise InvalidArgument(
                    f"{self.kind} {name!r} is already registered; pick another name or pass force=True",
                    field=name,
                )
            self._registered[name] = target
            return target

        return add(obj) if obj is not None else add

    def names(self) -> list[str]:
        """Every name `get` resolves without a dotted path: built-ins and registered parts."""
        return sorted({*self._builtins, *self._registered})

    def builtin_names(self) -> list[str]:
        """The names this project ships (not those registered by plugins or user code)."""
        return sorted(self._builtins)

    def builtin_paths(self) -> dict[str, str]:
        """Built-in name -> "pkg.module:attr" of the module that defines it."""
        return dict(self._builtins)

    def aliases(self) -> dict[str, str]:
        """Other spellings `get` resolves to a built-in, e.g. the dotted path of Trinity's own class."""
        return dict(self._aliases)

    def __contains__(self, name: str) -> bool:
        return name in self._registered or name in self._builtins or name in self._aliases

    def get(self, name: str, *, field: str | None = None) -> Any:
        """The part registered as `name`, the built-in `name`, or the object at dotted path `name`."""
        field = self.config_key if field is None else field
        if name in self._registered:
            return self._registered[name]
        if name in self._builtins:
            if name not in self._loaded:
                self._loaded[name] = import_object(self._builtins[name])
            return self._loaded[name]
        if name in self._aliases:
            return self.get(self._aliases[name], field=field)
        if "." in name or ":" in name:
            return self._import_user_part(name, field)
        hint = f", or {self.plugin_hint}" if self.plugin_hint else ""
        raise InvalidArgument(
            f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}, "
            f'or a dotted path "pkg.module:Name"{hint}',
            field=field,
        )

    def _import_user_part(self, path: str, field: str) -> Any:
        try:
            obj = import_object(path)
        except (ImportError, AttributeError) as exc:
            raise InvalidArgument(f"cannot import {self.kind} {path!r}: {exc}", field=field) from exc
        if not callable(obj):
            raise InvalidArgument(f"{self.kind} {path!r} is not callable", field=field)
        return obj


def check_args(fn: Callable[..., Any], args: Mapping[str, Any], config_key: str, skip: int = 0) -> None:
    """Reject keyword args `fn` does not accept (a misspelt `clip_range` must not be ignored).

    `skip`: leading positional parameters filled by the caller (tensors, the batch). A `**kwargs`
    parameter accepts everything.
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
