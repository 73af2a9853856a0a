"""YAML → OmegaConf (interpolation, `${oc.env:VAR,default}`) → pydantic, with errors that name the key."""

from __future__ import annotations

import enum
import os
import types
import typing
from collections.abc import Sequence
from importlib import resources
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from services.common.config.resolve import resolve_derived
from services.common.config.schema import TrinityConfig
from services.common.config.tasksets import repeat_times_conflict, resolve_tasksets
from services.common.config.trinity_keys import meaning_of, strip_inert
from services.common.errors import ConfigError

DEFAULT_CONFIG_NAME = "default.yaml"


def default_config_path() -> str:
    """The embedded default config shipped inside the package."""
    return str(resources.files("services.common.config") / DEFAULT_CONFIG_NAME)


def load_config(path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()) -> TrinityConfig:
    """Load, interpolate and validate a config file; `overrides` are dotlist items (`a.b=1`)."""
    raw = load_raw(path, overrides)
    return validate_config(raw)


def load_raw(path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    path = path or default_config_path()
    if not os.path.exists(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        conf = OmegaConf.load(os.fspath(path))
        merged = OmegaConf.merge(conf, OmegaConf.from_dotlist(list(overrides))) if overrides else conf
        data = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        raise ConfigError(
            f"cannot read {path}: {exc.msg if hasattr(exc, 'msg') else exc}", field=str(key)
        ) from exc
    except Exception as exc:  # yaml syntax errors
        raise ConfigError(f"cannot parse {path}: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must contain a mapping at the top level, got {type(data).__name__}")
    return {str(key): value for key, value in data.items()}


def validate_config(raw: dict[str, Any]) -> TrinityConfig:
    """Validate the tree and every stage (merged over the globals); raise ConfigError on the first error."""
    cfg = _validate(raw, prefix="")
    stage_configs = []
    seen: set[str] = set()
    for index, stage in enumerate(cfg.stages):
        if stage.stage_name in seen:
            raise ConfigError(
                f"duplicate stage_name {stage.stage_name!r}", field=f"stages[{index}].stage_name"
            )
        seen.add(stage.stage_name)
        merged = merge_stage(raw, stage.model_dump(exclude_none=True))
        stage_configs.append(_validate(merged, prefix=f"stages[{index}]."))
    cfg._stage_configs = stage_configs
    return cfg


def merge_stage(raw: dict[str, Any], stage: dict[str, Any]) -> dict[str, Any]:
    """The raw tree of one stage: the globals with the stage's sections merged over them."""
    base = {k: v for k, v in raw.items() if k != "stages"}
    overrides = {k: v for k, v in stage.items() if k not in ("stage_name",)}
    merged = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overrides)))
    assert isinstance(merged, dict)
    merged["name"] = f"{raw.get('name', TrinityConfig.model_fields['name'].default)}/{stage['stage_name']}"
    return merged  # type: ignore[return-value]


def _validate(raw: dict[str, Any], prefix: str) -> TrinityConfig:
    try:
        raw = strip_inert(raw)
    except ValueError as exc:
        raise ConfigError(prefix + str(exc), field=prefix + str(exc).split(" ", 1)[0]) from None
    try:
        cfg = TrinityConfig.model_validate(raw)  # algorithm presets are applied here (AlgorithmConfig)
    except ValidationError as exc:
        messages = [format_error(err, prefix) for err in exc.errors()]
        first = exc.errors()[0]
        raise ConfigError("\n".join(messages), field=prefix + _dotted(first["loc"])) from None
    conflict = repeat_times_conflict(cfg)
    if conflict:
        raise ConfigError(prefix + conflict, field=prefix + "buffer.explorer_input.taskset.repeat_times")
    return resolve_derived(resolve_tasksets(cfg))


def _dotted(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def format_error(err: Any, prefix: str = "") -> str:
    """One line per pydantic error: `key.path: what was wrong (expected ...)`."""
    loc = err["loc"]
    path = prefix + _dotted(loc)
    kind = err["type"]
    trinity = meaning_of(path)
    why = f" [Trinity key, {trinity.status} here: {trinity.meaning}]" if trinity else ""
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        return f"{path}: unknown key{why or hint}"
    if kind == "missing":
        expected = _expected_at(loc)
        return f"{path}: required value is missing" + (f" (expected {expected})" if expected else "")
    given = err.get("input")
    shown = f" (got {given!r})" if given is not None and not isinstance(given, dict) else ""
    return f"{path}: {err['msg']}{shown}{why}"


def _expected_at(loc: Sequence[Any]) -> str:
    """What the field at `loc` takes, e.g. `str`, `one of 'a', 'b'`, `a mapping (OperatorConfig)`;
    the field's docstring follows when it has one. Empty when `loc` cannot be followed."""
    annotation: Any = TrinityConfig
    field = None
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(part, int):
            args = typing.get_args(annotation)
            annotation = args[0] if args else Any
        elif _is_model(annotation) and part in annotation.model_fields:
            field = annotation.model_fields[part]
            annotation = field.annotation
        elif (
            typing.get_origin(annotation) in (dict, typing.Mapping) and len(typing.get_args(annotation)) == 2
        ):
            annotation, field = typing.get_args(annotation)[1], None  # a key of a map: its value type
        else:
            return ""
    described = _describe(annotation)
    doc = (field.description or "").strip().splitlines()[0] if field is not None and field.description else ""
    return f"{described}: {doc}" if doc else described


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and `| None` so lists, maps and models can be followed."""
    while True:
        origin = typing.get_origin(annotation)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin is typing.Annotated or (origin in (typing.Union, types.UnionType) and len(args) == 1):
            annotation = args[0]
        else:
            return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _describe(annotation: Any, nested: bool = False) -> str:
    """A short readable type for error messages (scripts/gen_config_docs.py renders the docs' fuller one)."""
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any value"
    if _is_model(annotation):
        return annotation.__name__ if nested else f"a mapping ({annotation.__name__})"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is typing.Annotated:
        return _describe(args[0], nested)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_describe(a, nested) for a in args))
    if origin in (list, tuple, set, frozenset, Sequence):
        return f"a list of {_describe(args[0], True)}" if args else "a list"
    if origin in (dict, typing.Mapping):
        return (
            f"a mapping of {_describe(args[0], True)} to {_describe(args[1], True)}"
            if len(args) == 2
            else "a mapping"
        )
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _allowed_keys(loc: Sequence[Any]) -> list[str]:
    """Field names of the model at `loc`, walking through nested models, lists and dicts."""
    model: Any = TrinityConfig
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = (
            model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        )
        if field is None:
            return []
        model = _model_of(field.annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return sorted(model.model_fields)
    return []


def _model_of(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None
