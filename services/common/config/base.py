"""Base model for every config section: unknown keys are errors, validators reject, never rewrite."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section. `extra="forbid"` makes a typo an error that names the key."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


def read_file_key(
    data: Any, file_key: str, value_key: str, where: str, parse: Callable[[str], Any] = str
) -> Any:
    """A `before` validator's step: the raw section with `file_key`'s file read (and parsed) into
    `value_key`; both given and different is an error, naming `<where>.<file_key>`."""
    path = data.get(file_key) if isinstance(data, dict) else None
    if path is None:
        return data
    try:
        value = parse(pathlib.Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{where}.{file_key} {path!r}: cannot read it ({exc.strerror})") from exc
    if data.get(value_key) not in (None, value):
        raise ValueError(f"{where}.{file_key} and {where}.{value_key} are one setting; give one")
    return {**data, value_key: value}
