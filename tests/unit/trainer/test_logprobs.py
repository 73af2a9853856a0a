"""Logprobs and entropy from logits: by hand, chunked equal to unchunked (values and gradients), on a
tiny model, and what the chunked form keeps for its backward pass."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer.batching import build_batch
from services.trainer.logprobs import (
    blocks,
    chunked_token_logprobs,
    response_logits,
    response_logprobs,
    token_logprobs,
)
from services.trainer.modeling import accepts_logits_to_keep
from tests.fakes.trainer import experience, tiny_model

TOL = {"atol": 1e-6, "rtol": 1e-6}


def assert_close_to_scale(ours: torch.Tensor, reference: torch.Tensor, rel: float = 1e-6) -> None:
    """Equal within rel of the reference's largest magnitude: a parameter's gradient sums many
    positions, so float32 rounding grows with its size (what the two computations may differ by)."""
    scale = float(reference.abs().max())
    assert float((ours - reference).abs().max()) <= rel * max(scale, 1.0)


def test_token_logprobs_by_hand() -> None:
    # logits [0, ln 3] -> p = [1/4, 3/4]; token 1: log(3/4); entropy -(1/4 ln 1/4 + 3/4 ln 3/4) ≈ 0.5623.
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    logprob, entropy = token_logprobs(logits, torch.tensor([[1]]), with_entropy=True)
    assert entropy is not None
    assert logprob.item() == pytest.approx(math.log(0.75))
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


def test_chunked_logprob_of_targets_by_hand() -> None:
    # Two positions, each its own block. Position 0: logits [0, 2 ln 3] at temperature 2 are [0, ln 3]:
    # p = [1/4, 3/4], token 1 -> log 3/4. Position 1: logits [ln 2, 0] at temperature 2 are [ln 2 / 2, 0]:
    # p = [√2, 1] / (1 + √2), token 0 -> log(√2 / (1 + √2)).
    # d log p(y) / d logits = (onehot(y) - p) / τ: position 0 -> [-1/8, 1/8].
    # The logits carry one more position (index 0) before the response: start = 1.
    logits = torch.tensor([[[9.0, 9.0], [0.0, 2 * math.log(3.0)], [math.log(2.0), 0.0]]], requires_grad=True)
    logprob, entropy = chunked_token_logprobs(
        logits, torch.tensor([[1, 0]]), start=1, temperature=2.0, with_entropy=True, chunk_tokens=1
    )
    assert entropy is not None
    root2 = math.sqrt(2.0)
    assert logprob[0].tolist() == pytest.approx([math.log(0.75), math.log(root2 / (1 + root2))], abs=1e-6)
    assert entropy[0, 0].item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    logprob[0, 0].backward()
    assert logits.grad is not None
    expected = torch.tensor([[0.0, 0.0], [-0.125, 0.125], [0.0, 0.0]])
    torch.testing.assert_close(logits.grad[0], expected, atol=1e-7, rtol=0)


def test_blocks_cover_every_position_once() -> None:
    for rows, positions, chunk in [(3, 5, 1), (3, 5, 4), (3, 5, 10), (4, 5, 5), (2, 7, 3), (1, 1, 256)]:
        seen = torch.zeros(rows, positions, dtype=torch.int64)
        for r, c in blocks(rows, positions, chunk):
            seen[r, c] += 1
            assert (r.stop - r.start) * (c.stop - c.start) <= max(chunk, 1)  # never more than asked
        assert bool((seen == 1).all()), (rows, positions, chunk)
    assert list(blocks(0, 5, 4)) == [] and list(blocks(3, 0, 4)) == []


@pytest.mark.parametrize("chunk", [1, 3, 5, 7, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_chunked_equals_unchunked_values_and_gradients(
    chunk: int, temperature: float, entropy_grad: bool
) -> None:
    torch.manual_seed(chunk)
    b, length, t, vocab, start = 3, 8, 5, 37, 2
    logits = torch.randn(b, length, vocab)
    tokens = torch.randint(0, vocab, (b, t))
    w_logprob, w_entropy = torch.randn(b, t), torch.randn(b, t)  # an arbitrary loss of both

    def run(chunked: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = logits.clone().requires_grad_()
        logprob, entropy = response_logprobs(
            x,
            start,
            tokens,
            temperature=temperature,
            chunk_tokens=chunk if chunked else None,
            with_entropy=True,
            entropy_grad=entropy_grad,
        )
        assert entropy is not None and entropy.requires_grad == entropy_grad
        loss = (logprob * w_logprob).sum() + ((entropy * w_entropy).sum() if entropy_grad else 0.0)
        loss.backward()
        assert x.grad is not None
        return logprob.detach(), entropy.detach(), x.grad

    for ours, reference in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(ours, reference, **TOL)


def test_an_entropy_only_loss_has_the_same_gradient() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    tokens = torch.randint(0, 11, (2, 6))
    grads = []
    for chunk in (4, None):
        x = logits.clone().requires_grad_()
        _, entropy = response_logprobs(
            x, 0, tokens, temperature=1.0, chunk_tokens=chunk, with_entropy=True, entropy_grad=True
        )
        assert entropy is not None
        entropy.sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], **TOL)


def test_without_entropy_only_logprobs_come_back() -> None:
    logits = torch.randn(2, 4, 9)
    tokens = torch.randint(0, 9, (2, 4))
    logprob, entropy = chunked_token_logprobs(logits, tokens, with_entropy=False, chunk_tokens=2)
    assert entropy is None
    torch.testing.assert_close(logprob, token_logprobs(logits, tokens, False)[0], **TOL)


def test_bfloat16_logits_are_reduced_in_float32_and_get_a_bfloat16_gradient() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 13).to(torch.bfloat16)
    tokens = torch.randint(0, 13, (2, 5))
    x = logits.clone().requires_grad_()
    logprob, _ = chunked_token_logprobs(x, tokens, with_entropy=False, chunk_tokens=3)
    logprob.sum().backward()
    assert logprob.dtype == torch.float32 and x.grad is not None and x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logprob, token_logprobs(logits, tokens, False)[0], **TOL)


def test_bad_shapes_and_chunk_sizes_are_refused() -> None:
    logits, tokens = torch.randn(2, 4, 9), torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_token_logprobs(logits, tokens, with_entropy=False, chunk_tokens=0)
    with pytest.raises(ValueError, match="outside"):
        chunked_token_logprobs(logits, tokens, start=1, with_entropy=False, chunk_tokens=2)
    with pytest.raises(ValueError, match=r"\[b, L, V\]"):
        chunked_token_logprobs(logits, tokens[0], with_entropy=False, chunk_tokens=2)


def test_the_backward_pass_keeps_the_logits_and_nothing_of_vocabulary_size_besides() -> None:
    """What autograd saves for the logprob/entropy computation: chunked, the logits themselves (no
    copy) and per-position floats; unchunked, several [b, T, V] float32 tensors (softmax, products)."""
    b, t, vocab = 2, 6, 50

    def saved_vocab_tensors(chunk: int | None) -> list[int]:
        logits = torch.randn(b, t + 1, vocab, requires_grad=True)
        ptrs: list[int] = []

        def pack(x: torch.Tensor) -> torch.Tensor:
            if x.shape[-1:] == (vocab,):
                ptrs.append(x.untyped_storage().data_ptr())
            return x

        base = logits * 1.0  # the model's output (a non-leaf)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            response_logprobs(
                base,
                0,
                torch.randint(0, vocab, (b, t)),
                temperature=0.7,
                chunk_tokens=chunk,
                with_entropy=True,
                entropy_grad=True,
            )
        return [p for p in ptrs if p != base.untyped_storage().data_ptr()]

    assert saved_vocab_tensors(4) == []
    assert len(set(saved_vocab_tensors(None))) >= 2


def test_a_tiny_models_logprobs_and_gradients_match_chunked_or_not() -> None:
    batch = build_batch(
        [experience("12+7=", "19"), experience("3=", "3;x"), experience("1=", "1")], pad_token_id=0
    )
    inputs = batch.inputs
    results = []
    for chunk in (2, None):
        model = tiny_model()
        logits, start = response_logits(model, inputs, logits_to_keep=accepts_logits_to_keep(model))
        logprob, entropy = response_logprobs(
            logits,
            start,
            inputs.responses,
            temperature=0.8,
            chunk_tokens=chunk,
            with_entropy=True,
            entropy_grad=True,
        )
        assert entropy is not None
        mask = batch.train.action_mask
        ((logprob * mask).sum() + 0.1 * (entropy * mask).sum()).backward()
        results.append((logprob.detach(), entropy.detach(), [p.grad for p in model.parameters()]))
    (lp, ent, grads), (lp0, ent0, grads0) = results
    torch.testing.assert_close(lp, lp0, **TOL)
    torch.testing.assert_close(ent, ent0, **TOL)
    for g, g0 in zip(grads, grads0, strict=True):
        assert_close_to_scale(g, g0)
