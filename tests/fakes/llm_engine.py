"""A stand-in for vLLM's LLMEngine (add_request / step / abort_request / has_unfinished_requests) with
DELTA outputs, for the unit tests of the step loop (services/explorer/engines/vllm_stream.py).

Each step gives every running request one token, a pure function of its whole prefix (prompt + tokens
so far) and the engine's `weights` (an int standing for the loaded weights), so a test can tell which
weights sampled a token given which prefix; EOS is held back until a request's min_tokens are met."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from services.explorer.engines.weight_pushes import TakesPushes, WeightPushes

EOS = 2


def next_token(prefix: list[int], weights: int) -> tuple[int, float]:
    """(token, logprob) the fake samples after `prefix` under `weights` (EOS when it lands on 2)."""
    token = (sum(prefix) * 7 + len(prefix) * 3 + weights * 5) % 13 + 2
    return token, -0.0625 * (token + 16 * weights)  # exact in float32, as the outputs hold it


@dataclass
class FakeRequest:
    prefix: list[int]
    max_tokens: int
    min_tokens: int
    generated: int = 0


@dataclass
class FakeLLMEngine:
    weights: int = 0
    requests: dict[str, FakeRequest] = field(default_factory=dict)
    added: list[tuple[str, list[int], int, int]] = field(default_factory=list)
    """(request id, prompt, max_tokens, min_tokens) of every add_request."""
    aborted: list[str] = field(default_factory=list)

    def add_request(self, request_id: str, prompt: dict[str, Any], sampling: Any) -> str:
        ids = list(prompt["prompt_token_ids"])
        self.requests[request_id] = FakeRequest(list(ids), sampling.max_tokens, sampling.min_tokens)
        self.added.append((request_id, ids, sampling.max_tokens, sampling.min_tokens))
        return f"{request_id}-internal"  # vLLM returns its internal id; outputs carry the one asked

    def abort_request(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self.requests.pop(request_id, None) is not None:
                self.aborted.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[SimpleNamespace]:
        outputs = []
        for request_id, req in list(self.requests.items()):
            token, logprob = next_token(req.prefix, self.weights)
            if token == EOS and req.generated < req.min_tokens:
                token, logprob = 3, -5.0
            req.prefix.append(token)
            req.generated += 1
            stopped = token == EOS
            finished = stopped or req.generated == req.max_tokens
            if finished:
                del self.requests[request_id]
            completion = SimpleNamespace(
                token_ids=[token],
                logprobs=[{token: SimpleNamespace(logprob=logprob)}],
                finish_reason="stop" if stopped else ("length" if finished else None),
            )
            outputs.append(SimpleNamespace(request_id=request_id, finished=finished, outputs=[completion]))
        return outputs


class FakeHost(TakesPushes):
    """The engine side of the loop (VLLMEngine's push interface, the real mixin) over a FakeLLMEngine: loading
    tensors {"w": k} sets the fake's `weights` to k; `refuse[k]` is raised instead for those."""

    def __init__(self, engine: FakeLLMEngine) -> None:
        self.engine = engine
        self.model_version = 0
        self.before_token: Any = None
        self.pushes = WeightPushes()
        self.refuse: dict[int, Exception] = {}
        self.loads_with_requests_running: list[int] = []

    def update_weights(self, named_tensors: Any) -> None:
        weights = dict(named_tensors)["w"]
        if weights in self.refuse:
            raise self.refuse[weights]
        if self.engine.requests:
            self.loads_with_requests_running.append(len(self.engine.requests))
        self.engine.weights = weights
