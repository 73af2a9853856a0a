"""The rollout hot path's encode/decode give exactly what transformers' tokenizer calls give."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from services.explorer.text import _backend, decode_responses, encode_plain
from services.models.loading import builtin_tokenizer

TEXTS = ["Hello, world! 12+34=46", "  spaces  and\ttabs\n", "ünïcödé ✓ done.", "a"]


def byte_level_bpe() -> PreTrainedTokenizerFast:
    """A small byte-level BPE (GPT-2 style) trained here, with an EOS special token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXTS * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", clean_up_tokenization_spaces=False
    )


@pytest.mark.parametrize("make", [builtin_tokenizer, byte_level_bpe], ids=["builtin-char", "byte-level-bpe"])
def test_fast_paths_match_transformers(make):
    tokenizer = make()
    assert _backend(tokenizer) is not None  # the fast path is the one under test
    for text in TEXTS:
        if (
            text != "ünïcödé ✓ done." or make is byte_level_bpe
        ):  # the char tokenizer knows digits and + = only
            assert encode_plain(tokenizer, text) == tokenizer(text, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    responses = [np.array(tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]) for t in TEXTS[:1]]
    responses.append(np.array([eos], dtype=np.int64))
    expected = [tokenizer.decode(r.tolist(), skip_special_tokens=True) for r in responses]
    assert decode_responses(tokenizer, responses) == expected


def test_a_tokenizer_that_cleans_up_spaces_goes_through_transformers():
    tokenizer = byte_level_bpe()
    tokenizer.clean_up_tokenization_spaces = True
    assert _backend(tokenizer) is None
    ids = tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    assert encode_plain(tokenizer, TEXTS[0]) == ids
    assert decode_responses(tokenizer, [np.array(ids)]) == [tokenizer.decode(ids, skip_special_tokens=True)]
