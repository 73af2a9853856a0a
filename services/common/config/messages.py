"""Config errors as one line each: `key.path: what was wrong (expected ...)`, with a Trinity key's
meaning appended (trinity_keys.py) and the allowed keys of a section for an unknown key."""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from services.common.config.schema import TrinityConfig
from services.common.config.trinity_keys import meaning_of

NAMED_KEY = re.compile(r"^([A-Za-z_]\w*(?:\.\w+|\[\d*\])+)")
"""A message that starts with a key path (`model.enable_prompt_truncation: false is ...`)."""


def dotted(loc: Sequence[Any]) -> str:
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
    path = prefix + dotted(loc)
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
    if kind == "value_error":  # our validators' own messages
        text = str(err["msg"]).removeprefix("Value error, ")
        named = NAMED_KEY.match(text)
        if named and (not loc or named.group(1).split(".")[0] == loc[0]):
            return prefix + text + why  # the message starts with the full key it refuses
        return f"{path}: {text}{shown}{why}" if path else prefix + text + why
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
