"""Token ids to text with the run's tokenizer, one piece per token, or the ids themselves.

The tokenizer is the stage's `model.tokenizer_path` (else `model_path`), loaded once by
services.models.loading.load_tokenizer; `--tokenizer` overrides it. When it cannot be loaded (a
checkpoint directory that moved, a hub id offline) the page shows token ids, labelled as such,
with the reason.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.common.config import TrinityConfig


@dataclass
class Decoder:
    """Per-token text of one tokenizer (None: ids only, `reason` says why)."""

    tokenizer: Any = None
    reason: str = ""
    source: str = ""
    _pieces: dict[int, str] = field(default_factory=dict)

    @property
    def has_text(self) -> bool:
        return self.tokenizer is not None

    def piece(self, token_id: int) -> str:
        """The text of one token (cached: a vocabulary is finite and pages repeat tokens)."""
        text = self._pieces.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id]) if self.tokenizer is not None else f"[{token_id}]"
            self._pieces[token_id] = text
        return text

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.piece(int(i)) for i in ids]


def tokenizer_source(cfg: TrinityConfig | None, override: str | None) -> str | None:
    if override:
        return override
    if cfg is None:
        return None
    return cfg.model.tokenizer_path or cfg.model.model_path


class Decoders:
    """One Decoder per tokenizer path, loaded on first use."""

    def __init__(self, override: str | None = None) -> None:
        self.override = override
        self._lock = threading.Lock()
        self._by_source: dict[str | None, Decoder] = {}

    def for_config(self, cfg: TrinityConfig | None) -> Decoder:
        source = tokenizer_source(cfg, self.override)
        with self._lock:
            if source not in self._by_source:
                self._by_source[source] = load_decoder(source)
            return self._by_source[source]


def load_decoder(source: str | None) -> Decoder:
    if not source:
        return Decoder(reason="the stage has no readable config naming a tokenizer (give --tokenizer)")
    from services.models.loading import load_tokenizer

    try:
        return Decoder(load_tokenizer(source), source=source)
    except Exception as exc:  # any loader failure (missing dir, offline hub id) is shown, not raised
        return Decoder(reason=f"cannot load tokenizer {source!r}: {type(exc).__name__}: {exc}", source=source)
