"""The record of what a Trinity-RFT key means here (trinity_keys.py and trinity_v06_keys.py fill it)."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

Status = Literal["mapped", "rejected", "not yet", "no effect"]
ANY = ("<any value>",)
"""`accepts` of a key whose every value is inert here."""


class KeyMeaning(NamedTuple):
    status: Status
    meaning: str
    accepts: tuple[Any, ...] = ()
    """`no effect` keys (not in the schema): the values that change nothing here, so the loader drops
    the key; any other value is refused with `meaning` (ANY: every value)."""


def inert(meaning: str, *accepts: Any) -> KeyMeaning:
    """A Trinity-only key that changes nothing here at `accepts` (ANY: at every value)."""
    return KeyMeaning("no effect", meaning, accepts or ANY)
