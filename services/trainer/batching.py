"""Experiences → tensors: the model's inputs and the algorithm's TrainBatch, row-aligned.

Layout ("response-aligned padding", as in veRL/Trinity): every row's prompt is left-padded to the
batch's widest prompt P and its response right-padded to the longest response T, so response token
t of every row sits in column P + t. The logits that predict the response are then one slice,
`logits[:, P-1 : P+T-1]`, and every per-token tensor of the algorithm is a plain [B, T] array.

Length bucketing: `micro_batches` sorts rows by length before chunking, so a micro-batch pads only
to its own longest row (`ModelInputs.select` trims the columns every selected row leaves empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from services.algorithms.batch import TrainBatch
from services.common.errors import InvalidArgument
from services.common.experience import Experience


@dataclass
class ModelInputs:
    """What the model sees for B rows: prompt left-padded to P columns, response right-padded to T."""

    input_ids: Tensor  # [B, P+T] long
    attention_mask: Tensor  # [B, P+T] long, 1 on real tokens
    position_ids: Tensor  # [B, P+T] long, 0 at each row's first real token
    prompt_width: int  # P
    prompt_lengths: Tensor  # [B] long, real prompt tokens per row
    response_lengths: Tensor  # [B] long, real response tokens per row

    @property
    def responses(self) -> Tensor:
        """[B, T] long: the response token ids (padding where the row is shorter)."""
        return self.input_ids[:, self.prompt_width :]

    @property
    def response_width(self) -> int:
        return int(self.input_ids.shape[1]) - self.prompt_width

    @property
    def num_tokens(self) -> int:
        """Real (non-pad) tokens, prompt + response: the figure tokens/s is measured in."""
        return int(self.attention_mask.sum())

    def select(self, idx: Tensor) -> ModelInputs:
        """Rows `idx`, trimmed to the widest prompt and the longest response among them."""
        prompt_lengths = self.prompt_lengths[idx]
        response_lengths = self.response_lengths[idx]
        p = int(prompt_lengths.max())
        t = int(response_lengths.max())
        cols = slice(self.prompt_width - p, self.prompt_width + t)
        return ModelInputs(
            input_ids=self.input_ids[idx, cols],
            attention_mask=self.attention_mask[idx, cols],
            position_ids=self.position_ids[idx, cols],
            prompt_width=p,
            prompt_lengths=prompt_lengths,
            response_lengths=response_lengths,
        )

    def to(self, device: Any) -> ModelInputs:
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
        )


@dataclass
class Batch:
    """One training step's data: model inputs + algorithm tensors (same rows, same order)."""

    inputs: ModelInputs
    train: TrainBatch
    needs_logprob: Tensor  # [B] bool: rows that arrived without behaviour logprobs (external agents)

    def __len__(self) -> int:
        return self.train.batch_size

    def select(self, idx: Tensor) -> Batch:
        """Rows `idx`; per-token tensors trimmed to the rows' longest response."""
        inputs = self.inputs.select(idx)
        return Batch(
            inputs, trim_tokens(self.train.select(idx), inputs.response_width), self.needs_logprob[idx]
        )


def trim_tokens(batch: TrainBatch, width: int) -> TrainBatch:
    """Every [B, T] field of `batch` cut to its first `width` columns ([B] fields untouched)."""
    cut = {}
    for f in fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, Tensor) and value.dim() == 2:
            cut[f.name] = value[:, :width]
    return replace(batch, **cut)


@dataclass
class _Row:
    """One sequence before padding (a DPO experience becomes two rows)."""

    prompt: np.ndarray
    response: np.ndarray
    exp: Experience
    is_expert: bool
    pair: int = -1


def untrainable_reason(exp: Experience, max_length: int | None = None) -> tuple[str, str] | None:
    """Why `exp` cannot be trained on, as (field, message), or None when it can."""
    n = 0 if exp.tokens is None else int(exp.tokens.shape[0])
    if exp.chosen is not None and exp.rejected is not None:
        if min(len(exp.chosen), len(exp.rejected)) == 0:
            return "chosen", "DPO rows need non-empty chosen and rejected responses"
        longest = n + max(len(exp.chosen), len(exp.rejected))
    elif n == 0:
        return "tokens", "the trainer needs token ids; tokenize chat-only experiences before writing them"
    elif exp.response_length <= 0:
        return "prompt_length", "experience has no response tokens"
    else:
        longest = n
    if max_length is not None and longest > max_length:
        return "tokens", f"{longest} tokens, more than the {max_length} the model takes (model.max_model_len)"
    return None


def _rows(experiences: Sequence[Experience], expert: Sequence[bool], max_length: int | None) -> list[_Row]:
    rows: list[_Row] = []
    for i, exp in enumerate(experiences):
        reason = untrainable_reason(exp, max_length)
        if reason is not None:
            raise InvalidArgument(reason[1], field=f"experiences[{i}].{reason[0]}")
        if exp.chosen is not None and exp.rejected is not None:
            prompt = np.array(exp.tokens, dtype=np.int64)
            pair = len(rows) // 2
            rows.append(_Row(prompt, np.array(exp.chosen, dtype=np.int64), exp, expert[i], pair))
            rows.append(_Row(prompt, np.array(exp.rejected, dtype=np.int64), exp, expert[i], pair))
            continue
        tokens = np.array(exp.tokens, dtype=np.int64)
        rows.append(_Row(tokens[: exp.prompt_length], tokens[exp.prompt_length :], exp, expert[i]))
    return rows


def _group_index(experiences: Sequence[_Row]) -> list[int]:
    """Rows from the same (batch_id, group_id or task_id) share an index, in order of first appearance."""
    seen: dict[tuple[int, str], int] = {}
    out: list[int] = []
    for row in experiences:
        key = (row.exp.batch_id, row.exp.group_id or row.exp.task_id or f"#row{len(out)}")
        out.append(seen.setdefault(key, len(seen)))
    return out


def _run_index(rows: Sequence[_Row], groups: list[int]) -> list[int]:
    """Rows of one run (same group, same run id) share an index, in order of first appearance."""
    seen: dict[tuple[int, int], int] = {}
    return [seen.setdefault((g, r.exp.run_id), len(seen)) for g, r in zip(groups, rows, strict=True)]


def _token_field(rows: list[_Row], name: str, width: int) -> Tensor | None:
    """Stack an optional per-response-token array; None unless every row carries it."""
    arrays = [getattr(r.exp, name) for r in rows]
    if any(a is None or a.shape[0] == 0 for a in arrays) or any(r.pair >= 0 for r in rows):
        return None
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, a in enumerate(arrays):
        out[i, : a.shape[0]] = torch.tensor(np.asarray(a, dtype=np.float32))
    return out


def build_batch(
    experiences: Sequence[Experience],
    *,
    pad_token_id: int,
    is_expert: Sequence[bool] | None = None,
    max_length: int | None = None,
) -> Batch:
    """Pad `experiences` into one Batch (see the module docstring for the layout).

    max_length: longest prompt + response accepted (model.max_model_len); longer rows are an
    InvalidArgument rather than a silent truncation, since truncating would misalign logprobs.
    """
    if not experiences:
        raise InvalidArgument("cannot build a training batch from zero experiences", field="experiences")
    rows = _rows(experiences, is_expert or [False] * len(experiences), max_length)
    n, p, t = len(rows), max(len(r.prompt) for r in rows), max(len(r.response) for r in rows)
    input_ids = torch.full((n, p + t), pad_token_id, dtype=torch.long)
    attention = torch.zeros(n, p + t, dtype=torch.long)
    action_mask = torch.zeros(n, t, dtype=torch.float32)
    old_logprob = torch.zeros(n, t, dtype=torch.float32)
    needs_logprob = torch.zeros(n, dtype=torch.bool)
    for i, r in enumerate(rows):
        lp, lr = len(r.prompt), len(r.response)
        input_ids[i, p - lp : p] = torch.from_numpy(r.prompt)
        input_ids[i, p : p + lr] = torch.from_numpy(r.response)
        attention[i, p - lp : p + lr] = 1
        mask = (
            r.exp.action_mask
            if r.pair < 0 and r.exp.action_mask is not None and r.exp.action_mask.shape[0]
            else None
        )
        action_mask[i, :lr] = torch.tensor(np.asarray(mask, dtype=np.float32)) if mask is not None else 1.0
        logprobs = r.exp.logprobs if r.pair < 0 else None
        if logprobs is not None and logprobs.shape[0] == lr:
            old_logprob[i, :lr] = torch.tensor(np.asarray(logprobs, dtype=np.float32))
        else:
            needs_logprob[i] = True
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    inputs = ModelInputs(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        prompt_width=p,
        prompt_lengths=torch.tensor([len(r.prompt) for r in rows], dtype=torch.long),
        response_lengths=torch.tensor([len(r.response) for r in rows], dtype=torch.long),
    )
    pairs = [r.pair for r in rows]
    groups = _group_index(rows)
    train = TrainBatch(
        action_mask=action_mask,
        old_logprob=old_logprob,
        rewards=torch.tensor([float(r.exp.reward or 0.0) for r in rows], dtype=torch.float32),
        group_index=torch.tensor(groups, dtype=torch.long),
        model_version=torch.tensor([r.exp.model_version for r in rows], dtype=torch.long),
        token_level_rewards=_token_field(rows, "token_level_rewards", t),
        advantages=_token_field(rows, "advantages", t),
        returns=_token_field(rows, "returns", t),
        is_expert=torch.tensor([r.is_expert for r in rows], dtype=torch.bool),
        pair_index=torch.tensor(pairs, dtype=torch.long) if all(x >= 0 for x in pairs) else None,
        run_index=torch.tensor(_run_index(rows, groups), dtype=torch.long),
        step_index=torch.tensor([r.exp.step for r in rows], dtype=torch.long),
        teacher_logprob=_token_field(rows, "teacher_logprobs", t),
    )
    return Batch(inputs, train, needs_logprob)


def micro_batches(batch: Batch, micro_batch_size: int, max_tokens: int | None = None) -> list[Tensor]:
    """Row indices of each micro-batch: rows sorted by length, then chunked (length bucketing).

    `max_tokens` (trainer.use_dynamic_bsz): chunks are packed by a token budget instead of a row
    count, see `token_budget_chunks`. DPO batches (pair_index set) chunk whole pairs so chosen and
    rejected stay together.
    """
    if max_tokens is not None and batch.train.pair_index is None:
        return token_budget_chunks(batch.inputs.prompt_lengths, batch.inputs.response_lengths, max_tokens)
    lengths = batch.inputs.prompt_lengths + batch.inputs.response_lengths
    if batch.train.pair_index is not None:
        pair_len = lengths.view(-1, 2).max(dim=1).values
        pair_order = torch.argsort(pair_len, stable=True)
        per = max(1, micro_batch_size // 2)
        return [
            torch.stack([2 * chunk, 2 * chunk + 1], dim=1).reshape(-1)
            for chunk in torch.split(pair_order, per)
        ]
    order = torch.argsort(lengths, stable=True)
    return list(torch.split(order, micro_batch_size))


class MicroShares:
    """A micro-batch's share of its batch: of the rows (loss_scale) and of the action tokens
    (token_scale, for token-mean terms). The per-row token counts are read from the device once."""

    def __init__(self, batch: Batch) -> None:
        self.rows = len(batch)
        self.row_tokens = batch.train.action_mask.sum(dim=-1).cpu()
        self.tokens = max(float(self.row_tokens.sum()), 1.0)

    def of(self, idx: Tensor) -> tuple[float, float]:
        return len(idx) / self.rows, float(self.row_tokens[idx.cpu()].sum()) / self.tokens


def rows_to_train(batch: Batch, zero_advantage_is_inert: bool) -> Tensor:
    """Indices of the rows an update passes over: all of them, or, when the algorithm says a zero
    advantage adds nothing (GRPO without KL loss or entropy bonus), those with a nonzero advantage:
    a group whose samples all scored the same costs no forward/backward. Each micro-batch keeps its
    share of the whole batch's rows, so the update is the one all rows give."""
    everything = torch.arange(len(batch), device=batch.train.action_mask.device)
    advantages = batch.train.advantages
    if not zero_advantage_is_inert or advantages is None or batch.train.pair_index is not None:
        return everything
    return everything[(advantages * batch.train.action_mask).abs().sum(dim=1) > 0]


def token_budget_chunks(prompt_lengths: Tensor, response_lengths: Tensor, max_tokens: int) -> list[Tensor]:
    """Row indices packed greedily, shortest rows first, while a chunk's padded size stays in budget.

    A chunk of rows pads to its widest prompt plus its longest response (`ModelInputs.select`), so
    its cost is rows x (max prompt + max response); that is what must stay <= `max_tokens` (veRL's
    max_token_len_per_gpu, which counts the same padded tokens). A row alone over budget still
    gets a chunk of its own: it is trained, not dropped.
    """
    order = torch.argsort(prompt_lengths + response_lengths, stable=True)
    chunks: list[list[int]] = []
    current: list[int] = []
    widest_prompt = longest_response = 0
    for row in order.tolist():
        prompt, response = int(prompt_lengths[row]), int(response_lengths[row])
        wider_prompt, longer_response = max(widest_prompt, prompt), max(longest_response, response)
        if current and (len(current) + 1) * (wider_prompt + longer_response) > max_tokens:
            chunks.append(current)
            current, wider_prompt, longer_response = [], prompt, response
        current.append(row)
        widest_prompt, longest_response = wider_prompt, longer_response
    if current:
        chunks.append(current)
    return [torch.tensor(chunk, dtype=torch.long) for chunk in chunks]
