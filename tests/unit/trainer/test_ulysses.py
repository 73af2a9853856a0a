"""Ulysses' shape maths without a process group: N ranks simulated in one process with the same
split/join functions the all-to-all uses, and the checks that refuse a model naming the key."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from services.common.errors import FailedPrecondition, InvalidArgument
from services.trainer.ulysses import (
    KEY,
    check_model,
    join_chunks,
    kv_repeats,
    padded_length,
    setup_sequence_parallel,
    shard_slice,
    split_chunks,
)


def simulated_all_to_all(
    per_rank: list[torch.Tensor], scatter_dim: int, gather_dim: int
) -> list[torch.Tensor]:
    """What `ulysses.all_to_all` gives each of N ranks: piece i of rank j's input goes to rank i."""
    n = len(per_rank)
    sent = [split_chunks(x, scatter_dim, n) for x in per_rank]
    return [join_chunks([sent[j][i] for j in range(n)], gather_dim) for i in range(n)]


def test_padding_and_shards() -> None:
    assert [padded_length(n, 2) for n in (1, 2, 7, 8)] == [2, 2, 8, 8]
    assert padded_length(9, 4) == 12
    assert [shard_slice(12, 4, r) for r in range(4)] == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12)]
    with pytest.raises(ValueError, match="length 7 is not a multiple"):
        shard_slice(7, 2, 0)
    with pytest.raises(ValueError, match="does not split into 2"):
        split_chunks(torch.zeros(3, 5), 1, 2)


@pytest.mark.parametrize("n", [2, 4])
def test_sequence_shards_become_head_shards_and_back(n: int) -> None:
    b, heads, length, d = 2, 8, 12, 3
    full = torch.randn(b, heads, length, d)  # q as the model lays it out: [b, H, L, d]
    per = length // n
    seq_shards = [full[:, :, r * per : (r + 1) * per] for r in range(n)]  # rank r: [b, H, L/N, d]
    head_shards = simulated_all_to_all(seq_shards, scatter_dim=1, gather_dim=2)
    for r, got in enumerate(head_shards):
        assert got.shape == (b, heads // n, length, d)  # every position, H/N heads
        assert torch.equal(got, full[:, r * heads // n : (r + 1) * heads // n])
    # attention's output is [b, L, H/N, d]; the way back gives each rank its positions, every head
    outputs = [h.transpose(1, 2) for h in head_shards]
    back = simulated_all_to_all(outputs, scatter_dim=1, gather_dim=2)
    for r, got in enumerate(back):
        assert got.shape == (b, per, heads, d)
        assert torch.equal(got, full.transpose(1, 2)[:, r * per : (r + 1) * per])


def test_kv_repeats_follow_verls_rule() -> None:
    assert kv_repeats(2, 2) == 1 and kv_repeats(8, 4) == 1  # kv heads split evenly
    assert kv_repeats(1, 2) == 2 and kv_repeats(2, 8) == 4  # each kv head repeated to N
    with pytest.raises(InvalidArgument, match="3 key/value heads") as err:
        kv_repeats(3, 2)
    assert err.value.field == KEY


@pytest.mark.parametrize(("heads", "kv_heads", "n"), [(8, 2, 4), (4, 1, 2), (8, 4, 2), (4, 2, 4)])
def test_each_rank_keeps_every_query_heads_own_kv_head(heads: int, kv_heads: int, n: int) -> None:
    """Grouped-query attention: query head h reads kv head h // (heads / kv_heads). After the head
    split (and the repeat when kv_heads < N) the local ratio must map each local query head to a
    local copy of that same kv head."""
    repeats = kv_repeats(kv_heads, n)
    kv = torch.arange(kv_heads).repeat_interleave(repeats)  # which original kv head each copy is
    q = torch.arange(heads)
    for r in range(n):
        local_q = split_chunks(q, 0, n)[r]
        local_kv = split_chunks(kv, 0, n)[r]
        groups = len(local_q) // len(local_kv)  # what the inner attention's repeat uses
        for i, h in enumerate(local_q.tolist()):
            assert local_kv[i // groups] == h // (heads // kv_heads)


def tiny(kind: str, **extra: Any) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    dims = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "vocab_size": 11}
    config = AutoConfig.for_model(
        kind, **{**dims, "num_attention_heads": 4, "num_key_value_heads": 2, **extra}
    )
    return AutoModelForCausalLM.from_config(config)


def test_supported_models_pass_and_others_are_refused_naming_the_key() -> None:
    check_model(tiny("llama"), 2)
    check_model(tiny("qwen2"), 2)
    with pytest.raises(InvalidArgument, match="model type 'mistral'.*supported: llama, qwen2") as err:
        check_model(tiny("mistral"), 2)
    assert err.value.field == KEY
    with pytest.raises(InvalidArgument, match="does not divide the model's 4 attention heads"):
        check_model(tiny("llama"), 3)
    with pytest.raises(InvalidArgument, match="sliding-window"):
        check_model(tiny("qwen2", use_sliding_window=True, max_window_layers=0), 2)
    with pytest.raises(InvalidArgument, match="attention implementation 'flex_attention'"):
        model = tiny("llama")
        model.config._attn_implementation = "flex_attention"
        check_model(model, 2)


def test_sequence_parallelism_without_fsdp2_is_refused() -> None:
    assert setup_sequence_parallel(None, 1, tiny("llama")) is None
    with pytest.raises(FailedPrecondition, match=f"{KEY} 2 needs trainer.strategy fsdp2"):
        setup_sequence_parallel(None, 2, tiny("llama"))
