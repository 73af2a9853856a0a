"""Per-token log-probabilities and entropy from a model's logits, whole or in chunks of positions.

For a row of logits x [V] (after dividing by the sampling temperature τ) and its token y:

    lse = logsumexp(x);  log p(y) = x_y - lse;  H = lse - sum_j p_j x_j,  p = softmax(x)

`token_logprobs` computes this with plain torch ops over the whole [b, T, V] block. Its autograd
graph keeps a float32 [b, T, V] tensor per op (the softmax for the entropy) and its backward builds
several more (the logsumexp, gather and slice gradients): four or five copies, each 361 MiB for 4
rows of 480 positions over a 49k vocabulary (benchmarks/trainer_memory.py). `chunked_token_logprobs` gives the same numbers with one custom autograd
function that walks the logits a block of about `chunk_tokens` positions at a time: its forward keeps
only the logits (no copy) and two floats per position; its backward recomputes each block's softmax
and writes that block's gradient into the one [b, L, V] gradient the model's head needs anyway:

    d log p(y) / d x_k = 1[k = y] - p_k;     d H / d x_k = -p_k (x_k - E_p[x]);     d x / d logits = 1/τ

veRL's `entropy_from_logits_with_chunking` / `entropy_checkpointing` are the same idea for the
entropy; Liger-Kernel's fused linear cross-entropy goes further (it never forms the whole logits).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from services.trainer.batching import ModelInputs


def response_logits(model: nn.Module, inputs: ModelInputs, *, logits_to_keep: bool) -> tuple[Tensor, int]:
    """The model's logits [b, L, V] as it returned them (no copy) and the position among the L whose
    logits predict the first response token (the response's are start .. start + T - 1).

    logits_to_keep: the model's forward takes it (modeling.accepts_logits_to_keep); then only the
    last T + 1 positions' logits are computed, not the prompt's.
    """
    p, t = inputs.prompt_width, inputs.response_width
    kwargs: dict[str, Any] = {"logits_to_keep": t + 1} if logits_to_keep else {}
    out = model(
        input_ids=inputs.input_ids,
        attention_mask=inputs.attention_mask,
        position_ids=inputs.position_ids,
        use_cache=False,
        **kwargs,
    )
    return out.logits, 0 if logits_to_keep else p - 1


def response_logprobs(
    logits: Tensor,
    start: int,
    tokens: Tensor,
    *,
    temperature: float,
    chunk_tokens: int | None,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[Tensor, Tensor | None]:
    """Logprob (and entropy) [b, T] of `tokens` from logits [b, L, V] / temperature at positions
    start .. start + T - 1: in blocks of chunk_tokens positions, or all at once when it is None."""
    if chunk_tokens is not None:
        return chunked_token_logprobs(
            logits,
            tokens,
            start=start,
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            chunk_tokens=chunk_tokens,
        )
    logits = logits[:, start : start + tokens.shape[1]]
    if temperature != 1.0:
        logits = logits / temperature
    return token_logprobs(logits, tokens, with_entropy, entropy_grad=entropy_grad)


def token_logprobs(
    logits: Tensor, tokens: Tensor, with_entropy: bool, *, entropy_grad: bool = True
) -> tuple[Tensor, Tensor | None]:
    """Per-token log p(token) and entropy of the distribution, both [b, T] float32: the unchunked form.

    logits [b, T, V] (any dtype; reduced in float32), tokens [b, T] long.
    log p = logit[token] - logsumexp(logits); entropy = logsumexp - sum softmax * logits.
    entropy_grad=False: the entropy is a metric only, computed outside autograd (no [b, T, V]
    softmax kept for the backward pass).
    """
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    logprob = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logprob, None
    if not entropy_grad:
        with torch.no_grad():
            return logprob, lse.detach() - (torch.softmax(logits.detach(), dim=-1) * logits.detach()).sum(-1)
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprob, entropy


def chunked_token_logprobs(
    logits: Tensor,
    tokens: Tensor,
    *,
    start: int = 0,
    temperature: float = 1.0,
    with_entropy: bool,
    entropy_grad: bool = True,
    chunk_tokens: int,
) -> tuple[Tensor, Tensor | None]:
    """token_logprobs of `logits[:, start : start + T] / temperature`, a block of positions at a time.

    logits [b, L, V] as the model returned them (any dtype, any strides; never copied whole: slicing
    the response and dividing by τ happen per block), tokens [b, T] long with start + T <= L.
    Returns logprob and entropy [b, T] float32 (entropy None unless with_entropy). Gradient flows to
    `logits` through logprob, and through entropy when entropy_grad (else it is a constant metric).
    chunk_tokens: positions per block, about (a block is whole rows when a row is shorter, else a
    piece of one row); the float32 temporaries of a block are a few [chunk_tokens, V].
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if tokens.dim() != 2 or logits.dim() != 3 or logits.shape[0] != tokens.shape[0]:
        raise ValueError(
            f"logits [b, L, V] and tokens [b, T] expected, got {tuple(logits.shape)}, {tuple(tokens.shape)}"
        )
    if start < 0 or start + tokens.shape[1] > logits.shape[1]:
        raise ValueError(
            f"positions {start}..{start + tokens.shape[1]} outside the logits' {logits.shape[1]}"
        )
    logprob, entropy = _ChunkedLogprobs.apply(
        logits, tokens, start, float(temperature), chunk_tokens, with_entropy, entropy_grad
    )
    return logprob, entropy if with_entropy else None


def blocks(rows: int, positions: int, chunk_tokens: int) -> Iterator[tuple[slice, slice]]:
    """(row slice, position slice) blocks covering [rows, positions] with about chunk_tokens each."""
    if positions == 0 or rows == 0:
        return
    if positions <= chunk_tokens:  # several whole rows per block
        per_block = max(1, chunk_tokens // positions)
        for r0 in range(0, rows, per_block):
            yield slice(r0, min(rows, r0 + per_block)), slice(0, positions)
        return
    for r in range(rows):  # pieces of one row
        for t0 in range(0, positions, chunk_tokens):
            yield slice(r, r + 1), slice(t0, min(positions, t0 + chunk_tokens))


def _block(logits: Tensor, rows: slice, cols: slice, start: int, temperature: float) -> Tensor:
    """One block of scaled logits in float32 [r, c, V] (a fresh tensor, or a view when nothing changes)."""
    x = logits[rows, start + cols.start : start + cols.stop].float()
    return x / temperature if temperature != 1.0 else x


class _ChunkedLogprobs(torch.autograd.Function):
    """Forward: logprob and entropy block by block. Saved: the logits (as given), the tokens, and
    lse and E_p[x] (= lse - H) per position; the backward pass recomputes each block's softmax."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        tokens: Tensor,
        start: int,
        temperature: float,
        chunk_tokens: int,
        with_entropy: bool,
        entropy_grad: bool,
    ) -> tuple[Tensor, Tensor]:
        b, t = tokens.shape
        logprob = torch.empty(b, t, dtype=torch.float32, device=logits.device)
        entropy = torch.empty_like(logprob) if with_entropy else logprob.new_zeros(0)
        lse = torch.empty_like(logprob)
        mean_x = torch.empty_like(entropy)  # E_p[x] per position, for the entropy's gradient
        for rows, cols in blocks(b, t, chunk_tokens):
            x = _block(logits, rows, cols, start, temperature)  # [r, c, V]
            block_lse = lse[rows, cols] = torch.logsumexp(x, dim=-1)
            picked = x.gather(-1, tokens[rows, cols].unsqueeze(-1)).squeeze(-1)
            logprob[rows, cols] = picked - block_lse
            if with_entropy:  # as token_logprobs does it, so that the two agree to the last bits
                p = torch.softmax(x, dim=-1)
                mean_x[rows, cols] = p.mul_(x).sum(-1)  # E_p[x]
                entropy[rows, cols] = block_lse - mean_x[rows, cols]
                del p
            del x
        ctx.start, ctx.temperature, ctx.chunk_tokens = start, temperature, chunk_tokens
        ctx.entropy_grad = with_entropy and entropy_grad
        ctx.save_for_backward(logits, tokens, lse, mean_x)
        ctx.set_materialize_grads(False)
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logprob: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        logits, tokens, lse, mean_x = ctx.saved_tensors
        if not ctx.entropy_grad:
            grad_entropy = None
        if grad_logprob is None and grad_entropy is None:
            return (None,) * 7
        start, temperature = ctx.start, ctx.temperature
        b, t = tokens.shape
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
        grad[:, :start].zero_()  # positions outside the response get no gradient
        grad[:, start + t :].zero_()
        for rows, cols in blocks(b, t, ctx.chunk_tokens):
            x = _block(logits, rows, cols, start, temperature)
            # p as logsumexp's own backward computes it, so the gradients agree with autograd's
            p = torch.sub(x, lse[rows, cols].unsqueeze(-1)).exp_()  # [r, c, V]
            if grad_entropy is not None:  # dH/dx = -p (x - E_p[x])
                g = torch.sub(x, mean_x[rows, cols].unsqueeze(-1)).mul_(p)
                g.mul_(grad_entropy[rows, cols].unsqueeze(-1).neg())
                if grad_logprob is not None:
                    g.addcmul_(p, grad_logprob[rows, cols].unsqueeze(-1), value=-1.0)
            else:  # only log p: -p g, in p's own storage
                assert grad_logprob is not None
                g = p.mul_(grad_logprob[rows, cols].unsqueeze(-1).neg())
            if grad_logprob is not None:  # dlogp/dx = onehot(y) - p: the onehot part
                g.scatter_add_(-1, tokens[rows, cols].unsqueeze(-1), grad_logprob[rows, cols].unsqueeze(-1))
            del x, p
            if temperature != 1.0:
                g.div_(temperature)
            grad[rows, start + cols.start : start + cols.stop] = g
            del g
        return grad, None, None, None, None, None, None
