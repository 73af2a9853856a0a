"""Base model for every config section: unknown keys are errors, validators reject, never rewrite."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section. `extra="forbid"` makes a typo an error that names the key."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
