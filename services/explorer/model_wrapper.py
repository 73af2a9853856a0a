"""ModelWrapper: what a workflow calls to sample from the policy (Trinity-RFT's interface).

`chat(messages, **rollout_args)` / `generate(prompts, **rollout_args)` return `Experience`
objects (response_text, tokens = prompt + response, prompt_length, logprobs of the response,
model_version), n per prompt. `chat_async` / `generate_async` are the same for async workflows.
`get_openai_client()` serves an OpenAI-compatible HTTP API on loopback for agent code; with
`enable_history` every call is recorded and `extract_experience_from_history()` turns the calls
into experiences.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument
from services.common.experience import ChatMessage, Experience
from services.explorer.engines.base import BatchingEngine, GenerationOutput, SamplingParams
from services.explorer.mid_step import token_spans
from services.explorer.prompt_fit import (
    MASKED_RESPONSE_TEXT,
    PROMPT_TRUNCATED,
    PromptFit,
    PromptPlan,
    masked_arrays,
)
from services.explorer.rollout_args import SAMPLING_KEYS, check_rollout_args
from services.explorer.text import decode_responses, encode_plain


def plain_chat_format(messages: list[dict[str, Any]]) -> str:
    """Fallback when the tokenizer has no chat template: "role: content" lines, then "assistant: "."""
    lines = [f"{m['role']}: {m.get('content') or ''}" for m in messages]
    return "\n".join(lines) + "\nassistant: "


def _fitted(params: SamplingParams, plan: PromptPlan) -> SamplingParams:
    """`params` within the plan's response budget (min_tokens too: vLLM refuses min_tokens > max_tokens)."""
    if plan.max_tokens in (0, params.max_tokens):
        return params
    return replace(params, max_tokens=plan.max_tokens, min_tokens=min(params.min_tokens, plan.max_tokens))


def _by_params(plans: list[tuple[PromptPlan, SamplingParams]]) -> dict[SamplingParams, list[int]]:
    """Indices of the prompts to generate on, grouped by their (fitted) sampling params."""
    groups: dict[SamplingParams, list[int]] = {}
    for i, (plan, params) in enumerate(plans):
        if not plan.masked:
            groups.setdefault(params, []).append(i)
    return groups


class ModelWrapper:
    """The policy as a workflow sees it. One per runner slot; engines are shared."""

    def __init__(
        self,
        engine: BatchingEngine,
        tokenizer: Any,
        *,
        max_prompt_tokens: int = 1024,
        max_response_tokens: int = 512,
        min_response_tokens: int = 0,
        enable_history: bool = False,
        chat_template: str | None = None,
        enable_thinking: bool | None = None,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        version_fn: Callable[[], int] = lambda: 0,
        model_name: str = "policy",
        api_key: str = "EMPTY",
        api_port: int | None = None,
        enable_prompt_truncation: bool = True,
        max_model_len: int | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.prompt_fit = PromptFit(max_prompt_tokens, enable_prompt_truncation, max_model_len)
        self.max_response_tokens = max_response_tokens
        self.min_response_tokens = min_response_tokens
        self.enable_history = enable_history
        self.chat_template = chat_template
        self.template_kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        self.tool_call_parser = tool_call_parser  # read by the OpenAI API (openai_server.py)
        self.reasoning_parser = reasoning_parser
        self._version_fn = version_fn
        self.model_name = model_name
        self.api_key = api_key  # the OpenAI API asks for it unless EMPTY (openai_server.py)
        self.api_port = api_port  # the OpenAI API's port; None: a free one
        self.history: list[Experience] = []
        self._history_lock = threading.Lock()
        self._openai_server: Any = None
        self._openai_client: Any = None

    @property
    def model_version(self) -> int:
        return self._version_fn()

    # --- prompts ---------------------------------------------------------------------------------

    def sampling_params(self, **kwargs: Any) -> SamplingParams:
        """Trinity/vLLM-style rollout args -> SamplingParams (unknown keys are an error)."""
        check_rollout_args(kwargs)
        if kwargs.get("max_tokens") is None and kwargs.get("max_completion_tokens") is not None:
            kwargs["max_tokens"] = kwargs["max_completion_tokens"]
        args = {k: v for k, v in kwargs.items() if k in SAMPLING_KEYS and v is not None}
        args.setdefault("max_tokens", self.max_response_tokens)
        args.setdefault("min_tokens", self.min_response_tokens)
        args["max_tokens"] = min(int(args["max_tokens"]), self.max_response_tokens)
        args["top_k"] = max(int(args.get("top_k", 0)), 0)
        return SamplingParams(**args)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text of a conversation: the chat template with enable_thinking (the config's) and
        `template_kwargs` (a request's own, e.g. the OpenAI API's chat_template_kwargs) over it."""
        template = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        if tools and not template:
            raise InvalidArgument("tools need a chat template (model.custom_chat_template)", field="tools")
        if template:
            extra = {**self.template_kwargs, **(template_kwargs or {}), **({"tools": tools} if tools else {})}
            return self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=True,
                chat_template=template,
                **extra,
            )
        return plain_chat_format(messages)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` without special tokens and without truncation."""
        return encode_plain(self.tokenizer, text)

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt as generated on: truncated from the left to max_prompt_tokens, or
        whole with model.enable_prompt_truncation false (see prompt_fit.py)."""
        return self._plan(text, self.max_response_tokens).ids

    def _plan(self, text: str, max_tokens: int) -> PromptPlan:
        ids = self.tokenize(text)
        if not ids:
            raise InvalidArgument("the prompt is empty after tokenization", field="prompt")
        return self.prompt_fit.plan(ids, max_tokens)

    def _to_experiences(
        self,
        outputs: list[GenerationOutput],
        prompt_text: str,
        messages: list[dict[str, Any]] | None,
        overlong: bool = False,
    ) -> list[Experience]:
        exps = []
        version = self.model_version
        texts = decode_responses(self.tokenizer, [out.response_ids for out in outputs])
        for out, text in zip(outputs, texts, strict=True):
            prompt = np.asarray(out.prompt_ids, dtype=np.int64)
            info: dict[str, Any] = {"finish_reason": out.finish_reason}
            if overlong:
                info["prompt_overlong"] = 1
            if out.token_versions is not None and len(out.token_versions):
                # the versions that sampled it (several when weights were loaded mid-generation)
                info["model_versions"], info["version_starts"] = token_spans(out.token_versions)
            exp = Experience(
                tokens=np.concatenate([prompt, out.response_ids.astype(np.int64)]),
                prompt_length=len(prompt),
                model_version=info["model_versions"][0] if "model_versions" in info else version,
                logprobs=out.logprobs,
                action_mask=np.ones(len(out.response_ids), dtype=bool),
                response_text=text,
                prompt_text=prompt_text,
                info=info,
            )
            exps.append(self._with_messages(exp, messages))
        return self._recorded(exps)

    def _masked(
        self, plan: PromptPlan, n: int, prompt_text: str, messages: list[dict[str, Any]] | None
    ) -> list[Experience]:
        """n masked-out samples of a prompt that leaves no room in the context (prompt_fit.py)."""
        exps = []
        for _ in range(n):
            tokens, prompt_length, logprobs, mask = masked_arrays(plan)
            exp = Experience(
                tokens=tokens,
                prompt_length=prompt_length,
                model_version=self.model_version,
                logprobs=logprobs,
                action_mask=mask,
                response_text=MASKED_RESPONSE_TEXT,
                prompt_text=prompt_text,
                info={"finish_reason": "length", "truncate_status": PROMPT_TRUNCATED, "prompt_overlong": 1},
            )
            exps.append(self._with_messages(exp, messages))
        return self._recorded(exps)

    @staticmethod
    def _with_messages(exp: Experience, messages: list[dict[str, Any]] | None) -> Experience:
        if messages is not None:
            exp.messages = [ChatMessage(m["role"], m.get("content") or "") for m in messages]
            exp.messages.append(ChatMessage("assistant", exp.response_text))
        return exp

    def _recorded(self, exps: list[Experience]) -> list[Experience]:
        if self.enable_history:
            with self._history_lock:
                self.history.extend(exps)
        return exps

    def _plans(self, texts: list[str], params: SamplingParams) -> list[tuple[PromptPlan, SamplingParams]]:
        out = []
        for text in texts:
            plan = self._plan(text, params.max_tokens)
            out.append((plan, _fitted(params, plan)))
        return out

    def _run(
        self, texts: list[str], params: SamplingParams, messages: list[dict[str, Any]] | None
    ) -> list[Experience]:
        plans = self._plans(texts, params)
        results: dict[int, list[GenerationOutput]] = {}
        for fitted, idx in _by_params(plans).items():
            for i, outs in zip(
                idx, self.engine.generate([plans[i][0].ids for i in idx], fitted), strict=True
            ):
                results[i] = outs
        return self._assemble(texts, plans, results, params.n, messages)

    async def _run_async(
        self, texts: list[str], params: SamplingParams, messages: list[dict[str, Any]] | None
    ) -> list[Experience]:
        plans = self._plans(texts, params)
        results: dict[int, list[GenerationOutput]] = {}
        for fitted, idx in _by_params(plans).items():
            outs = await self.engine.generate_async([plans[i][0].ids for i in idx], fitted)
            results.update(zip(idx, outs, strict=True))
        return self._assemble(texts, plans, results, params.n, messages)

    def _assemble(
        self,
        texts: list[str],
        plans: list[tuple[PromptPlan, SamplingParams]],
        results: dict[int, list[GenerationOutput]],
        n: int,
        messages: list[dict[str, Any]] | None,
    ) -> list[Experience]:
        exps: list[Experience] = []
        for i, (text, (plan, _)) in enumerate(zip(texts, plans, strict=True)):
            if plan.masked:
                exps.extend(self._masked(plan, n, text, messages))
            else:
                exps.extend(self._to_experiences(results[i], text, messages, plan.overlong))
        return exps

    # --- Trinity's API ----------------------------------------------------------------------------

    def generate(self, prompts: list[str] | str, **kwargs: Any) -> list[Experience]:
        """n samples per prompt, flattened in prompt order."""
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        return self._run(texts, self.sampling_params(**kwargs), None)

    async def generate_async(self, prompts: list[str] | str, **kwargs: Any) -> list[Experience]:
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        return await self._run_async(texts, self.sampling_params(**kwargs), None)

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Experience]:
        """n replies to one conversation (`tools`: OpenAI tool definitions, given to the chat template;
        `template_kwargs`: more chat-template variables, over the config's enable_thinking)."""
        text = self.render_chat(messages, tools, template_kwargs)
        return self._run([text], self.sampling_params(**kwargs), messages)

    async def chat_async(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[Experience]:
        text = self.render_chat(messages)
        return await self._run_async([text], self.sampling_params(**kwargs), messages)

    def generate_tokens(self, prompt_ids: list[int], **kwargs: Any) -> list[Experience]:
        """Token-in, token-out (multi-turn workflows extend the context without re-tokenizing it)."""
        plan, params = self._token_plan(prompt_ids, self.sampling_params(**kwargs))
        results = self.engine.generate([plan.ids], params)
        return self._to_experiences(results[0], "", None, plan.overlong)

    async def generate_tokens_async(self, prompt_ids: list[int], **kwargs: Any) -> list[Experience]:
        plan, params = self._token_plan(prompt_ids, self.sampling_params(**kwargs))
        results = await self.engine.generate_async([plan.ids], params)
        return self._to_experiences(results[0], "", None, plan.overlong)

    def _token_plan(self, prompt_ids: list[int], params: SamplingParams) -> tuple[PromptPlan, SamplingParams]:
        """A token prompt is never cut: within token_limit() it only gets the context's response budget."""
        plan = self.prompt_fit.plan(self._check_ids(prompt_ids), params.max_tokens)
        return plan, _fitted(params, plan)

    def _check_ids(self, prompt_ids: list[int]) -> list[int]:
        limit = self.prompt_fit.token_limit()
        if not prompt_ids or len(prompt_ids) > limit:
            raise InvalidArgument(
                f"a token prompt needs 1..{limit} tokens (model.max_prompt_tokens"
                f"{'' if self.prompt_fit.truncate else ', or max_model_len - 1 without truncation'}), "
                f"got {len(prompt_ids)}",
                field="prompt_ids",
            )
        return [int(t) for t in prompt_ids]

    # --- scoring (a teacher's view of a sequence) ------------------------------------------------

    def logprobs(self, tokens: list[int], temperature: float = 1.0) -> np.ndarray:
        """float32 [len(tokens) - 1]: logprob of each token after the first given what precedes it."""
        return self.engine.with_weights_locked(lambda e: e.score_batch([list(tokens)], temperature))[0]

    async def logprobs_async(self, tokens: list[int], temperature: float = 1.0) -> np.ndarray:
        return (await self.engine.score_async([list(tokens)], temperature))[0]

    # --- history and the OpenAI API --------------------------------------------------------------

    def extract_experience_from_history(self, clear_history: bool = True) -> list[Experience]:
        """The experiences of every call since the last extraction (enable_history must be on)."""
        if not self.enable_history:
            raise InvalidArgument(
                "history is off; set explorer.rollout_model.enable_history: true",
                field="explorer.rollout_model.enable_history",
            )
        with self._history_lock:
            exps = list(self.history)
            if clear_history:
                self.history.clear()
        return exps

    @property
    def openai_base_url(self) -> str:
        from services.explorer.openai_server import OpenAIServer

        if self._openai_server is None:
            self._openai_server = OpenAIServer(self, port=self.api_port or 0, api_key=self.api_key)
            self._openai_server.start()
        return self._openai_server.base_url

    def get_openai_client(self) -> Any:
        """An `openai.OpenAI` client talking to this model over loopback HTTP (needs the openai package)."""
        try:
            import openai
        except ImportError as exc:
            raise InvalidArgument(
                "get_openai_client needs the openai package: pip install openai",
                field="explorer.rollout_model.enable_openai_api",
            ) from exc
        if self._openai_client is None:  # one per wrapper: thread-safe, and workflows are many
            client = openai.OpenAI(base_url=self.openai_base_url, api_key=self.api_key)
            client.model_path = self.model_name  # type: ignore[attr-defined]  # Trinity's attribute
            self._openai_client = client
        return self._openai_client

    def get_openai_async_client(self) -> Any:
        try:
            import openai
        except ImportError as exc:
            raise InvalidArgument(
                "get_openai_async_client needs the openai package: pip install openai",
                field="explorer.rollout_model.enable_openai_api",
            ) from exc
        client = openai.AsyncOpenAI(base_url=self.openai_base_url, api_key=self.api_key)
        client.model_path = self.model_name  # type: ignore[attr-defined]
        return client

    def close(self) -> None:
        if self._openai_client is not None:
            self._openai_client.close()
            self._openai_client = None
        if self._openai_server is not None:
            self._openai_server.stop()
            self._openai_server = None
