"""The default engine: batched sampling with a KV cache on any transformers causal LM, CPU or GPU.

A hand-written loop rather than `model.generate` (with an implicit GenerationConfig that may
add top_k=50): it makes sampling explicit (temperature, then top-k, then top-p; logprobs are
taken under the tempered distribution, see sample_tokens), masks after the first EOS, and costs
nothing per step beyond one forward pass. Prompts are left-padded; position ids come from the
attention mask so padding does not shift positions.

Forward passes are spent on what is new only: the n samples of a prompt share one prefill (its KV
cache rows are repeated), the prefill computes the last position's logits only, and sequences that
finished leave the batch (their cache rows dropped) once they are an eighth of it. On SmolLM2-135M
with the demo's 8 prompts x 8 samples x 64 tokens on 2 CPU cores this took a batch from 20 s to 7.5 s
and the process's peak RSS from 2.0 to 1.2 GB.

Partial rollouts (`push_weights`): weights that arrive while a batch is generating are loaded
between two tokens, and the in-flight sequences go on under them instead of being discarded. The
KV cache of the tokens so far is recomputed with the new weights (one prefill), so every token
sampled after the switch, and its logprob, is exactly the new policy's given the tokens before it;
each output records the version of each of its tokens (GenerationOutput.token_versions).

Streaming (`on_token`): each sequence's tokens are handed out as they are sampled, its EOS included,
nothing after it; the outputs returned at the end hold exactly the same ids and logprobs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from services.common.errors import InvalidArgument
from services.explorer.engines.base import GenerationOutput, InferenceEngine, SamplingParams, TokenSink
from services.explorer.engines.weight_pushes import TakesPushes, WeightPushes
from services.explorer.engines.weights import copy_into_module
from services.models.loading import context_length


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    banned: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of logits [B, V]; returns (tokens [B], logprobs [B]).

    The token is drawn from softmax(logits / T) restricted by top-k, top-p and `banned` (EOS
    before min_tokens). The logprob reported is log_softmax(logits / T) of that token: temperature
    applied, filters not, which is what the trainer recomputes from a forward pass, so the
    importance ratio of on-policy data starts at 1. temperature 0 is greedy with T = 1 logprobs.
    """
    logits = logits.float()
    if params.temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        masked = logits if banned is None else logits.index_fill(-1, banned, float("-inf"))
        tokens = masked.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logits = logits / params.temperature
    logp = torch.log_softmax(logits, dim=-1)
    if banned is not None:
        logits = logits.index_fill(-1, banned, float("-inf"))
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        remove_sorted = (probs.cumsum(dim=-1) - probs) >= params.top_p
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    tokens = draw(torch.softmax(logits, dim=-1), generator)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of probs [B, V], index i with probability probs[b, i] / sum(probs[b]).

    Inverse-CDF sampling: one uniform number per row against the running sum (float64). It draws
    from the same distribution as torch.multinomial, which on CPU draws an exponential number per
    vocabulary entry: 19 ms of a 64 x 49k step's ~120 ms on 2 cores, against ~2 ms here.
    """
    cdf = probs.double().cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device)
    # the first index whose running sum exceeds u * total: never one of probability 0
    picked = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return picked.clamp(max=probs.shape[-1] - 1).squeeze(-1)


class TransformersEngine(TakesPushes, InferenceEngine):
    """Wraps a loaded `AutoModelForCausalLM` (eval mode, no grad)."""

    streams = True

    def __init__(
        self,
        model: Any,
        *,
        eos_token_ids: Iterable[int],
        pad_token_id: int,
        max_batch_size: int = 256,
        seed: int = 42,
    ) -> None:
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.eos_token_ids = sorted(set(int(t) for t in eos_token_ids))
        if not self.eos_token_ids:
            raise ValueError("the tokenizer has no EOS token; generation could never stop")
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = max_batch_size
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._eos = torch.tensor(self.eos_token_ids, device=self.device)
        self.context_limit = context_length(model)
        """Positions the model has; generation stops there ("length") instead of indexing past them."""
        # the KV cache's argument: transformers renamed `past_key_values` to `cache` (the old name warns on every
        # run and goes in 5.40); the older transformers of .venv-vllm (vLLM's CPU build) has only the old one
        forward = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"
        self._keeps_logits = "logits_to_keep" in forward
        """The model can compute the last position's logits only (a prefill needs no others)."""
        self.model_version = 0
        """The version of the weights loaded (push_weights and versioned loads set it; 0: the base model)."""
        self.pushes = WeightPushes()
        self.before_token: Callable[[int], None] | None = None
        """Test hook: called with the token index before each decoding step of a batch."""

    def generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, on_token: TokenSink | None = None
    ) -> list[list[GenerationOutput]]:
        flat = [p for p in prompts for _ in range(params.n)]
        outputs: list[GenerationOutput] = []
        for start in range(0, len(flat), self.max_batch_size):
            sink = on_token
            if on_token is not None and start > 0:
                sink = functools.partial(_shifted, on_token, start)
            outputs.extend(self._generate(flat[start : start + self.max_batch_size], params, sink))
        return [outputs[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    @torch.inference_mode()
    def _generate(
        self, prompts: list[list[int]], params: SamplingParams, on_token: TokenSink | None = None
    ) -> list[GenerationOutput]:
        batch, width = len(prompts), max(len(p) for p in prompts)
        if self.context_limit is not None and width + params.max_tokens > self.context_limit:
            if width >= self.context_limit:
                raise InvalidArgument(
                    f"a prompt of {width} tokens leaves no room in the model's {self.context_limit} positions; "
                    "lower model.max_prompt_tokens",
                    field="model.max_prompt_tokens",
                )
            params = dataclasses.replace(params, max_tokens=self.context_limit - width)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention[row, width - len(prompt) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        tokens = torch.full(
            (batch, params.max_tokens), self.pad_token_id, dtype=torch.long, device=self.device
        )
        logprobs = torch.zeros((batch, params.max_tokens), dtype=torch.float32, device=self.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        lengths = torch.full((batch,), params.max_tokens, dtype=torch.long, device=self.device)
        versions = torch.zeros((batch, params.max_tokens), dtype=torch.long)
        # The working batch: `rows` (indices into the full batch) are the sequences still generating;
        # attention, the next step's ids and positions and the KV cache hold those rows only.
        rows = torch.arange(batch, device=self.device)
        past: Any = None
        step_ids, step_pos, steps, whole = input_ids, _positions(attention), 0, True
        for t in range(params.max_tokens):
            if self.before_token is not None:
                self.before_token(t)
            if self.apply_pending_weights():
                # the cache holds the old weights' keys and values: prefill prompt + tokens so far again
                whole = True
                step_ids = torch.cat([input_ids[rows], tokens[rows, :t]], dim=1)
                step_pos = _positions(attention)
            versions[rows.cpu(), t] = self.model_version
            if whole:
                last, past = self._prefill(step_ids, attention)
                whole = False
            else:
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=attention,
                    position_ids=step_pos,
                    use_cache=True,
                    **{self._cache_arg: past},
                )
                last, past = out.logits[:, -1, :], getattr(out, self._cache_arg)
            banned = self._eos if t < params.min_tokens else None
            new, new_lp = sample_tokens(last, params, self.generator, banned)
            done = finished[rows]
            new = torch.where(done, torch.full_like(new, self.pad_token_id), new)
            tokens[rows, t], logprobs[rows, t], steps = new, new_lp, t + 1
            if on_token is not None:
                _hand_out(on_token, rows, new, new_lp, done)
            stopped = rows[torch.isin(new, self._eos) & ~done]
            lengths[stopped] = t + 1
            finished[stopped] = True
            if bool(finished.all()):
                break
            attention = torch.cat(
                [attention, torch.ones((len(rows), 1), dtype=attention.dtype, device=self.device)], dim=1
            )
            step_ids, step_pos = new[:, None], step_pos[:, -1:] + 1
            keep = (~finished[rows]).nonzero().squeeze(1)
            if _worth_compacting(len(keep), len(rows)) and hasattr(past, "reorder_cache"):
                # finished sequences leave the batch: later steps compute only the live ones
                past.reorder_cache(keep)
                rows, attention, step_ids, step_pos = (
                    rows[keep],
                    attention[keep],
                    step_ids[keep],
                    step_pos[keep],
                )
        tokens_np = tokens[:, :steps].cpu().numpy()
        logprobs_np = logprobs[:, :steps].cpu().numpy()
        lengths_np, finished_np = lengths.clamp(max=steps).cpu().numpy(), finished.cpu().numpy()
        return [
            GenerationOutput(
                prompt_ids=list(prompts[row]),
                response_ids=tokens_np[row, : lengths_np[row]].astype(np.int64),
                logprobs=logprobs_np[row, : lengths_np[row]].astype(np.float32),
                finish_reason="stop" if finished_np[row] else "length",
                token_versions=versions[row, : lengths_np[row]].numpy(),
            )
            for row in range(batch)
        ]

    def _prefill(self, ids: torch.Tensor, attention: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Forward pass over whole sequences; returns (last logits [B, V], KV cache of B rows).

        Identical rows (the n samples of one prompt) are computed once and their cache entries
        repeated; only the last position's logits are computed where the model allows it.
        """
        keep_last = {"logits_to_keep": 1} if self._keeps_logits else {}
        width = ids.shape[1]
        unique, inverse = torch.unique(torch.cat([ids, attention], dim=1), dim=0, return_inverse=True)
        rows = (unique[:, :width], unique[:, width:]) if len(unique) < len(ids) else (ids, attention)
        out = self.model(
            input_ids=rows[0],
            attention_mask=rows[1],
            position_ids=_positions(rows[1]),
            use_cache=True,
            **keep_last,
        )
        last, past = out.logits[:, -1, :], getattr(out, self._cache_arg)
        if len(unique) == len(ids):
            return last, past
        if hasattr(past, "reorder_cache"):
            past.reorder_cache(inverse)
            return last[inverse], past
        # a cache we cannot index: compute every row
        out = self.model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=_positions(attention),
            use_cache=True,
            **keep_last,
        )
        return out.logits[:, -1, :], getattr(out, self._cache_arg)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        copy_into_module(self.model, named_tensors)

    def score_batch(self, sequences: list[list[int]], temperature: float = 1.0) -> list[np.ndarray]:
        return [sequence_logprobs(self.model, list(seq), 1, temperature) for seq in sequences]

    def close(self) -> None:
        self.model = None


def _shifted(on_token: TokenSink, offset: int, row: int, token_id: int, logprob: float) -> None:
    on_token(row + offset, token_id, logprob)


def _hand_out(
    on_token: TokenSink, rows: torch.Tensor, new: torch.Tensor, logprobs: torch.Tensor, finished: torch.Tensor
) -> None:
    """This step's token of every sequence not finished before it (an EOS is handed out, padding is not)."""
    ids, lps, done = new.tolist(), logprobs.tolist(), finished.tolist()
    for row, token_id, logprob, was_done in zip(rows.tolist(), ids, lps, done, strict=True):
        if not was_done:
            on_token(row, int(token_id), float(logprob))


def _positions(attention: torch.Tensor) -> torch.Tensor:
    """Position ids from a left-padded attention mask (padding does not shift positions)."""
    return (attention.cumsum(-1) - 1).clamp(min=0)


def _worth_compacting(live: int, working: int) -> bool:
    """Drop finished rows from the working batch once they are an eighth of it: each drop copies the
    KV cache once, about what one decoding step's cache append costs."""
    return live < working and (working - live) * 8 >= working


def sequence_logprobs(
    model: Any, tokens: list[int], prompt_length: int, temperature: float = 1.0
) -> np.ndarray:
    """Logprobs of tokens[prompt_length:] under `model` (one forward pass): teacher scores, checks."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        ids = torch.tensor([tokens], dtype=torch.long, device=device)
        logits = model(input_ids=ids).logits[0, prompt_length - 1 : -1].float()
        if temperature > 0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(-1, ids[0, prompt_length:, None]).squeeze(-1).cpu().numpy()
