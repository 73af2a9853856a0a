"""Fakes shared by the trainer's unit tests (plain objects; the integration tests use real services)."""

from __future__ import annotations

import numpy as np
import torch

from services.algorithms.batch import TrainBatch
from services.common.experience import Experience
from services.trainer.algorithms.api import Algorithm, ReadRequest, SampleStrategy


class OneRead(SampleStrategy):
    def plan(self, *, train_batch_size: int, model_version: int) -> list[ReadRequest]:
        return [ReadRequest(source="experience", batch_size=train_batch_size)]


class NllAlgorithm(Algorithm):
    """Token-mean negative log-likelihood of the response (SFT), per micro-batch times its share of
    the batch's tokens (token_scale; loss_scale, the rows' share, where none is given)."""

    name = "fake-nll"
    use_reference = False
    use_critic = False
    needs_old_logprob = False
    sample_strategy = OneRead()

    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        return {}

    def compute_loss(self, batch, logprob, entropy, values=None, *, loss_scale=1.0, token_scale=None):
        mask = batch.action_mask
        nll = -(logprob * mask).sum() / mask.sum().clamp(min=1)
        return nll * (loss_scale if token_scale is None else token_scale), {"pg_loss": float(nll.detach())}


class RowShareNllAlgorithm(NllAlgorithm):
    """The same loss from an Algorithm written before token shares: compute_loss takes loss_scale only."""

    def compute_loss(self, batch, logprob, entropy, values=None, *, loss_scale=1.0):
        return super().compute_loss(batch, logprob, entropy, values, loss_scale=loss_scale)


def experience(
    prompt: str,
    response: str,
    *,
    task_id: str = "",
    reward: float = 0.0,
    logprobs: bool = False,
    version: int = 0,
    batch_id: int = 0,
) -> Experience:
    """An Experience from text via the builtin char tokenizer (ids = 4 + printable index)."""
    from services.models.loading import builtin_tokenizer

    tok = builtin_tokenizer()
    p = tok.encode(prompt, add_special_tokens=False)
    r = tok.encode(response, add_special_tokens=False)
    return Experience(
        tokens=np.array(p + r, dtype=np.int64),
        prompt_length=len(p),
        model_version=version,
        reward=reward,
        logprobs=np.full(len(r), -1.0, dtype=np.float32) if logprobs else None,
        task_id=task_id,
        batch_id=batch_id,
    )


def tiny_model(seed: int = 0) -> torch.nn.Module:
    from services.models.loading import build_builtin

    return build_builtin("builtin:tiny-arith", seed=seed)


class BigramLogits(torch.nn.Module):
    """A causal LM whose logits at a position depend only on that position's token: row `token` of
    a fixed [V, V] table (zeros unless `prefer` sets one), so per-token logprobs can be worked out
    by hand. It takes the keyword arguments the trainer passes a model and returns `.logits`."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.register_buffer("table", torch.zeros(vocab_size, vocab_size))

    def prefer(self, after: int, token: int, logit: float) -> BigramLogits:
        """After token `after`, give `token` this logit (the others keep 0)."""
        self.table[after, token] = logit
        return self

    def forward(self, input_ids: torch.Tensor, **_: object) -> object:
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.table[input_ids])
