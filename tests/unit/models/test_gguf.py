"""services/models/gguf.py: a tiny Llama written here as a GGUF file (with the `gguf` package, in
llama.cpp's layout: q/k rows permuted for its rotary kernel, a byte-level BPE vocabulary, a chat
template) converts back to an HF checkpoint with the same logits; broken or unsupported files fail
with errors naming the file."""

from __future__ import annotations

import pathlib

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from services.common.errors import InvalidArgument
from services.models.gguf import convert_gguf

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 32, 2, 4, 2, 64
TOKENS = [*bytes_to_unicode().values(), "<s>", "</s>", "<|im_start|>", "<|im_end|>", "ab"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (its convert script's permute), which the GGUF reader undoes."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str) -> str:
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf in fixed:
        return fixed[hf]
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    module = rest.removesuffix(".weight")
    return f"blk.{layer}.{HF_TO_GGUF[module]}.weight"


def write_tiny_llama_gguf(path: pathlib.Path, arch: str = "llama") -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(TOKENS),
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=256,
        eos_token_id=257,
    )
    model = LlamaForCausalLM(config).eval()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(len(TOKENS))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([1] * 256 + [3] * 4 + [1])
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(257)
    writer.add_chat_template(TEMPLATE)
    for name, tensor in model.state_dict().items():
        array = tensor.detach().numpy().astype(np.float32)
        if name.endswith("q_proj.weight"):
            array = llama_permute(array, HEADS)
        elif name.endswith("k_proj.weight"):
            array = llama_permute(array, KV_HEADS)
        writer.add_tensor(gguf_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def test_round_trip_logits_config_tokenizer_template(tmp_path: pathlib.Path) -> None:
    source = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    done = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")
    assert done.architecture == "LlamaForCausalLM"
    assert done.parameters == sum(p.numel() for p in source.parameters())
    assert done.has_chat_template
    converted = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert converted.config.num_key_value_heads == KV_HEADS
    ids = torch.tensor([[256, 5, 9, 200, 3, 260, 257]])
    with torch.no_grad():
        diff = (source(ids).logits - converted(ids).logits).abs().max().item()
    assert diff < 1e-5  # fp32 in, fp32 out: the permutation undone exactly
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer.chat_template == TEMPLATE
    assert tokenizer.decode(tokenizer("hello").input_ids) == "hello"
    assert tokenizer.convert_tokens_to_ids("ab") == 260  # the merge survived


def test_not_a_gguf_file_and_missing_file(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    with pytest.raises(InvalidArgument, match="is not a GGUF file"):
        convert_gguf(bad, tmp_path / "out")
    with pytest.raises(InvalidArgument, match="does not exist"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_file_fails_cleanly_and_leaves_no_output(tmp_path: pathlib.Path) -> None:
    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    data = (tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 3])
    with pytest.raises(InvalidArgument, match="cannot read .*cut.gguf"):
        convert_gguf(tmp_path / "cut.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_unsupported_architecture_is_named(tmp_path: pathlib.Path) -> None:
    write_tiny_llama_gguf(tmp_path / "odd.gguf", arch="notanarch")
    with pytest.raises(InvalidArgument, match="notanarch"):
        convert_gguf(tmp_path / "odd.gguf", tmp_path / "out")
