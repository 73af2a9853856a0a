"""Builtin models and tokenizer: round trips, determinism across builds, save/load of checkpoints."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument
from services.models.loading import (
    builtin_tokenizer,
    count_parameters,
    is_builtin,
    load_causal_lm,
    load_tokenizer,
    save_model,
)


@pytest.mark.parametrize("text", ["047+385=0432", "999+999=1998", "12-7=5\n", "a b"])
def test_tokenizer_round_trips_character_per_token(text):
    tok = load_tokenizer("builtin:tiny-arith")
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text


def test_tokenizer_special_tokens_and_skip_on_decode():
    tok = builtin_tokenizer()
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}) == 4
    ids = tok("432")["input_ids"] + [tok.eos_token_id, tok.pad_token_id]
    assert tok.decode(ids) == "432<eos><pad>"
    assert tok.decode(ids, skip_special_tokens=True) == "432"
    assert tok.apply_chat_template([{"role": "user", "content": "1+2="}], tokenize=False) == "1+2="


def test_unknown_characters_map_to_unk():
    tok = builtin_tokenizer()
    assert tok("é")["input_ids"] == [tok.unk_token_id]


def test_builtin_weights_are_identical_for_same_seed_and_differ_across_seeds():
    a = load_causal_lm("builtin:tiny-arith", seed=7).state_dict()
    b = load_causal_lm("builtin:tiny-arith", seed=7).state_dict()
    c = load_causal_lm("builtin:tiny-arith", seed=8).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["transformer.h.0.attn.c_attn.weight"], c["transformer.h.0.attn.c_attn.weight"])


def test_builtin_build_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_causal_lm("builtin:tiny-arith")
    assert torch.equal(torch.rand(3), expected)


def test_builtin_model_shape_and_eval_mode():
    tok = load_tokenizer("builtin:tiny-arith")
    model = load_causal_lm("builtin:tiny-arith")
    assert not model.training
    assert model.config.vocab_size == len(tok)
    assert model.config.n_layer == 3 and model.config.n_embd == 128 and model.config.n_head == 4
    assert 500_000 < count_parameters(model) < 800_000
    assert next(model.parameters()).dtype == torch.float32


def test_unknown_builtin_and_bad_dtype_are_rejected():
    assert is_builtin("builtin:nope") and not is_builtin("gpt2") and not is_builtin(None)
    with pytest.raises(InvalidArgument, match="tiny-arith"):
        load_causal_lm("builtin:nope")
    with pytest.raises(InvalidArgument, match="dtype"):
        load_causal_lm("builtin:tiny-arith", dtype="float8")


def test_save_and_load_directory_round_trip(tmp_path):
    tok = load_tokenizer("builtin:tiny-arith")
    model = load_causal_lm("builtin:tiny-arith", seed=3)
    save_model(model, tok, tmp_path / "ckpt")
    loaded = load_causal_lm(str(tmp_path / "ckpt"))
    tok2 = load_tokenizer(str(tmp_path / "ckpt"))
    ids = torch.tensor([tok("047+385=")["input_ids"]])
    assert tok2("047+385=")["input_ids"] == ids[0].tolist()
    assert (tok2.eos_token_id, tok2.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert not loaded.training
