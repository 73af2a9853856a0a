"""The vLLM engine's generation loop, stepped here so weights can change between two tokens.

Each sequence of a batch is one request to vLLM's LLMEngine (`add_request`, n = 1); the loop calls
`step()` until none is left, with DELTA outputs: every step returns the tokens sampled since the
last one, which are appended to their row and handed to `on_token` as they come. This is the loop
LLM.generate runs itself (it only asks for final outputs instead), as fast on a real model
(vllm_engine.py's docstring has the measurement), so it serves every batch, streaming or not.

Partial rollouts. Between two steps, the loop first calls the test hook `before_token(t)` (t: the
most tokens any row holds, the index of the batch's next token; mid_step.arm_hold) and then looks
for weights pushed while it generates (weight_pushes.py). When some are queued:

1. the requests still running are aborted (vLLM frees their KV blocks);
2. the weights load through the engine's own update (VLLMEngine.update_weights: checked against the
   checkpoint layout, reloaded by the workers, prefix cache reset) and the engine takes their version;
3. each unfinished row is added again as a new request: prompt = its prompt + the tokens it holds,
   max_tokens and min_tokens less the tokens it holds (min never below 0).

vLLM then prefills the whole prefix under the new weights, so every later token and its logprob is
the new policy's given the tokens before it, as in the transformers engine (which recomputes its KV
cache the same way). No token of a row is discarded or sampled again: the new tokens go on the same
row, and each records the version that sampled it (GenerationOutput.token_versions). In vLLM's
multiprocess mode the engine core may have sampled a few tokens the loop has not received when it
aborts; those never reached a row and go with the abort (the row continues from what it holds).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from services.explorer.engines.base import GenerationOutput, SamplingParams, TokenSink

_request_ids = itertools.count()


class WeightHost(Protocol):
    """What the loop needs of the engine it runs for (VLLMEngine)."""

    model_version: int
    before_token: Callable[[int], None] | None

    @property
    def pending_weights(self) -> bool: ...

    def apply_pending_weights(self) -> bool: ...


@dataclass
class Row:
    """One sequence of the batch: its prompt and what it has sampled so far."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None
    """"stop" (EOS) or "length" once vLLM finished it; None while it runs."""

    def output(self) -> GenerationOutput:
        return GenerationOutput(
            prompt_ids=self.prompt,
            response_ids=np.asarray(self.ids, dtype=np.int64),
            logprobs=np.asarray(self.logprobs, dtype=np.float32),
            finish_reason=self.finish or "length",  # set for every row returned (StepLoop.run)
            token_versions=np.asarray(self.versions, dtype=np.int64),
        )


def resume_limits(params: SamplingParams, generated: int) -> tuple[int, int]:
    """(max_tokens, min_tokens) of a request added again with `generated` tokens already sampled:
    the tokens it still may / must sample (min_tokens never below 0)."""
    return params.max_tokens - generated, max(0, params.min_tokens - generated)


class StepLoop:
    """Generates one batch on a vLLM LLMEngine (see the module docstring).

    `sampling(max_tokens, min_tokens)` makes the vLLM SamplingParams of a request (DELTA outputs);
    `host` is the engine whose pushed weights are applied between steps."""

    def __init__(
        self,
        engine: Any,
        params: SamplingParams,
        sampling: Callable[[int, int], Any],
        host: WeightHost,
        on_token: TokenSink | None = None,
    ) -> None:
        self.engine = engine
        self.params = params
        self.sampling = sampling
        self.host = host
        self.on_token = on_token
        self.rows: list[Row] = []
        self.live: dict[str, int] = {}
        """request id (the one asked for and the one vLLM returns) -> row, since the last abort."""
        self.asked: list[str] = []
        """The ids asked for since the last abort (what abort_request takes; a finished one is a no-op)."""

    def run(self, prompts: list[list[int]]) -> list[GenerationOutput]:
        rows = self.rows = [Row(list(p)) for p in prompts]
        try:
            for index in range(len(rows)):
                self._add(index)
            while self.engine.has_unfinished_requests():
                if self.host.before_token is not None:
                    self.host.before_token(max(len(row.ids) for row in rows))
                if self.host.pending_weights:
                    self._switch()
                for out in self.engine.step():
                    self._take(out)
        except BaseException:
            self._abort()
            raise
        unfinished = [index for index, row in enumerate(rows) if row.finish is None]
        if unfinished:  # vLLM dropped a request without a final output: never hand out a cut row as whole
            raise RuntimeError(f"vLLM has no request left but rows {unfinished} of the batch never finished")
        return [row.output() for row in rows]

    def _add(self, index: int) -> None:
        row = self.rows[index]
        max_tokens, min_tokens = resume_limits(self.params, len(row.ids))
        asked = f"trinity-{next(_request_ids)}"
        request = {"prompt_token_ids": [*row.prompt, *row.ids]}
        returned = self.engine.add_request(asked, request, self.sampling(max_tokens, min_tokens))
        self.live[asked] = self.live[str(returned or asked)] = index
        self.asked.append(asked)

    def _abort(self) -> None:
        if self.asked:
            self.engine.abort_request(self.asked)
        self.live, self.asked = {}, []

    def _switch(self) -> None:
        """Abort the running requests, load the pushed weights, add each unfinished row again."""
        self._abort()
        self.host.apply_pending_weights()
        for index, row in enumerate(self.rows):
            if row.finish is None:
                self._add(index)

    def _take(self, out: Any) -> None:
        index = self.live.get(out.request_id)
        if index is None:  # a request aborted at a switch (vLLM drops these itself; kept safe)
            return
        row, completion = self.rows[index], out.outputs[0]
        tokens = completion.token_ids
        # one {token id: Logprob} per token; the sampled one is always there
        logprobs = [
            step[token].logprob for token, step in zip(tokens, completion.logprobs or [], strict=True)
        ]
        row.ids.extend(tokens)
        row.logprobs.extend(logprobs)
        row.versions.extend([self.host.model_version] * len(tokens))
        if self.on_token is not None:
            for token, logprob in zip(tokens, logprobs, strict=True):
                self.on_token(index, int(token), float(logprob))
        if out.finished:
            row.finish = "stop" if completion.finish_reason == "stop" else "length"
