"""Token ids <-> text for the rollout hot path.

transformers' `tokenizer(text)` and `tokenizer.decode(ids)` cost ~100 us and ~20 us a call in
Python around the Rust tokenizer (argument handling, `to_py_obj` over every id); on small models the
explorer spent a tenth of each step there. A fast tokenizer whose decode needs no clean-up pass
(`clean_up_tokenization_spaces` false, as modern chat models set it) is called on its Rust backend
directly, a whole batch of responses in one call; any other tokenizer goes through transformers.
tests/unit/explorer/test_text.py checks both paths give the same ids and text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def _backend(tokenizer: Any) -> Any | None:
    """The `tokenizers.Tokenizer` behind a fast tokenizer, when calling it directly changes nothing."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "decode_batch"):
        return None
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    return backend


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` without special tokens and without truncation."""
    backend = _backend(tokenizer)
    if backend is not None:
        return list(backend.encode(text, add_special_tokens=False).ids)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def decode_responses(tokenizer: Any, responses: Sequence[np.ndarray]) -> list[str]:
    """Text of each response, special tokens skipped."""
    ids = [r.tolist() for r in responses]
    backend = _backend(tokenizer)
    if backend is not None:
        return list(backend.decode_batch(ids, skip_special_tokens=True))
    return [tokenizer.decode(i, skip_special_tokens=True) for i in ids]
