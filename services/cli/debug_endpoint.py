"""`trinity debug --endpoint URL`: sample from a running OpenAI-compatible server instead of loading the model.

Workflows still get the explorer's ModelWrapper: it renders and tokenizes prompts with the config's
tokenizer, and its engine is this one, which sends the token ids to `URL/completions` (token-id
prompts, as vLLM takes them) and reads back the sampled token ids with their logprobs (`logprobs`
with vLLM's `return_tokens_as_token_ids`), so an experience holds what the server sampled, never
text tokenized again. vLLM's OpenAI server and the explorer's own OpenAI API
(services/explorer/openai_server.py) answer so; a server that returns tokens as text is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from services.common.errors import FailedPrecondition
from services.common.http_json import call_json
from services.explorer.engines.base import (
    BatchingEngine,
    EnginePool,
    GenerationOutput,
    InferenceEngine,
    SamplingParams,
)

TOKEN_ID_PREFIX = "token_id:"


def completion_request(model: str, prompts: list[list[int]], params: SamplingParams) -> dict[str, Any]:
    """The body of one /completions call sampling `params.n` responses for each token-id prompt."""
    return {
        "model": model,
        "prompt": prompts,
        "n": params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # vLLM's "no top-k"
        "max_tokens": params.max_tokens,
        "min_tokens": params.min_tokens,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }


def token_id(token: str, where: str) -> int:
    """12 from "token_id:12"; a token given as text means the server ignored return_tokens_as_token_ids."""
    if not token.startswith(TOKEN_ID_PREFIX):
        raise FailedPrecondition(
            f"{where}: the server returned the token {token!r} as text, not as {TOKEN_ID_PREFIX}<id>; "
            "--endpoint needs a server that honours return_tokens_as_token_ids (vLLM's OpenAI server, "
            "the explorer's OpenAI API)",
            field="--endpoint",
        )
    return int(token[len(TOKEN_ID_PREFIX) :])


def parse_completion(reply: dict[str, Any], prompts: list[list[int]], n: int) -> list[list[GenerationOutput]]:
    """A /completions reply -> `n` outputs per prompt (choice index = prompt index * n + sample)."""
    choices = sorted(reply.get("choices") or [], key=lambda c: int(c["index"]))
    if len(choices) != len(prompts) * n:
        raise FailedPrecondition(
            f"the endpoint answered {len(choices)} choices for {len(prompts)} prompt(s) x n={n}",
            field="--endpoint",
        )
    outputs: list[list[GenerationOutput]] = [[] for _ in prompts]
    for choice in choices:
        index = int(choice["index"])
        logprobs = choice.get("logprobs")
        if not logprobs or "tokens" not in logprobs:
            raise FailedPrecondition(
                f"choice {index} has no logprobs.tokens; --endpoint needs a server that returns the "
                "sampled tokens' logprobs of /completions",
                field="--endpoint",
            )
        where = f"choice {index}"
        ids = [token_id(str(t), where) for t in logprobs["tokens"]]
        values = logprobs.get("token_logprobs") or []
        if len(values) != len(ids) or any(v is None for v in values):
            raise FailedPrecondition(
                f"{where}: logprobs.token_logprobs must hold one number per sampled token", field="--endpoint"
            )
        prompt = prompts[index // n]
        outputs[index // n].append(
            GenerationOutput(
                prompt_ids=list(prompt),
                response_ids=np.asarray(ids, dtype=np.int64),
                logprobs=np.asarray(values, dtype=np.float32),
                finish_reason=str(choice.get("finish_reason") or "length"),
            )
        )
    return outputs


class EndpointEngine(InferenceEngine):
    """Samples on an OpenAI-compatible server at `base_url` (`http://host:port/v1`); see the module docstring."""

    def __init__(
        self, base_url: str, *, api_key: str = "EMPTY", model: str | None = None, timeout: float = 600.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.model = model or self.served_models()[0]

    def _call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return call_json(
            self.base_url, path, body, api_key=self.api_key, timeout=self.timeout, field="--endpoint"
        )

    def served_models(self) -> list[str]:
        """The model ids the server lists at /models."""
        models = [str(m["id"]) for m in self._call("/models").get("data", [])]
        if not models:
            raise FailedPrecondition(f"{self.base_url}/models lists no model", field="--endpoint")
        return models

    def generate_batch(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        reply = self._call("/completions", completion_request(self.model, prompts, params))
        return parse_completion(reply, prompts, params.n)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        raise FailedPrecondition(
            "the endpoint's weights belong to its server; trinity debug never changes them",
            field="--endpoint",
        )


def endpoint_pool(
    base_url: str, *, api_key: str = "EMPTY", model: str | None = None
) -> Callable[[Any, Any], EnginePool]:
    """A `make_pool(cfg, tokenizer)` for services/explorer/server.build_parts: one engine on the endpoint."""

    def make_pool(cfg: Any, tokenizer: Any) -> EnginePool:
        engine = EndpointEngine(base_url, api_key=api_key, model=model, timeout=cfg.explorer.max_timeout)
        return EnginePool([BatchingEngine(engine, name="endpoint")])

    return make_pool
