"""A remote OpenAI-compatible chat API as the policy of `mode: bench` (Trinity's model.external_model).

`ExternalChatModel` has the ModelWrapper methods eval workflows call: `chat` / `chat_async` post the
conversation to `<base url>/chat/completions`, `generate` / `generate_async` post a text prompt to
`<base url>/completions`. Each reply becomes a chat-only Experience (messages and response_text, no
token ids, model_version 0), which is all bench needs: workflows score the text, eval.py averages the
rewards. What needs token ids (generate_tokens, logprobs, training) is refused naming the key.
The base URL and the API key are read from the environment variables the config names
(`base_url_env`, `api_key_env`), as Trinity does, so no secret sits in the config.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np

from services.common.config.model import ModelConfig
from services.common.errors import FailedPrecondition
from services.common.experience import ChatMessage, Experience
from services.common.http_json import call_json
from services.explorer.rollout_args import check_rollout_args

FIELD = "model.external_model"


class ExternalChatModel:
    """The policy as a workflow sees it, answered by a remote chat API (see the module docstring)."""

    model_version = 0
    enable_history = False

    def __init__(
        self,
        base_url: str,
        model_name: str,
        *,
        api_key: str = "",
        max_response_tokens: int = 512,
        enable_thinking: bool | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model_name = model_name
        self.api_key = api_key
        self.max_response_tokens = max_response_tokens
        self.enable_thinking = enable_thinking
        self.timeout = timeout
        self.history: list[Experience] = []

    @classmethod
    def from_config(cls, model: ModelConfig) -> ExternalChatModel:
        """From model.external_model: the base URL must be in the environment variable it names."""
        ext = model.external_model
        base_url = os.environ.get(ext.base_url_env, "")
        if not base_url:
            raise FailedPrecondition(
                f"{FIELD}.base_url_env: the environment variable {ext.base_url_env} is unset or empty; "
                "export the API's base URL there (e.g. http://host:8000/v1)",
                field=f"{FIELD}.base_url_env",
            )
        return cls(
            base_url,
            ext.model_name or model.model_path,
            api_key=os.environ.get(ext.api_key_env, ""),
            max_response_tokens=model.max_response_tokens,
            enable_thinking=model.enable_thinking,
        )

    # --- requests --------------------------------------------------------------------------------

    def sampling(self, **kwargs: Any) -> dict[str, Any]:
        """Rollout args -> the request's sampling fields (unknown keys are an error, as in ModelWrapper)."""
        check_rollout_args(kwargs)
        asked = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens") or self.max_response_tokens
        body: dict[str, Any] = {
            "n": int(kwargs.get("n") or 1),
            "max_tokens": min(int(asked), self.max_response_tokens),
        }
        for key in ("temperature", "top_p"):
            if kwargs.get(key) is not None:
                body[key] = float(kwargs[key])
        if self.enable_thinking is not None:  # vLLM-style servers hand it to the chat template
            body["chat_template_kwargs"] = {"enable_thinking": self.enable_thinking}
        return body

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return call_json(
            self.base_url,
            path,
            {"model": self.model_name, **body},
            api_key=self.api_key,
            timeout=self.timeout,
            field=FIELD,
        )

    def _experiences(
        self, reply: dict[str, Any], prompt_text: str, messages: list[dict[str, Any]], chat: bool
    ) -> list[Experience]:
        exps = []
        for choice in sorted(reply.get("choices") or [], key=lambda c: int(c.get("index", 0))):
            text = (
                str((choice.get("message") or {}).get("content") or "")
                if chat
                else str(choice.get("text") or "")
            )
            history = [ChatMessage(m["role"], str(m.get("content") or "")) for m in messages]
            exps.append(
                Experience(
                    tokens=np.zeros(0, dtype=np.int64),
                    prompt_length=0,
                    model_version=0,
                    messages=[*history, ChatMessage("assistant", text)],
                    response_text=text,
                    prompt_text=prompt_text,
                    info={"finish_reason": str(choice.get("finish_reason") or "stop")},
                )
            )
        if not exps:
            raise FailedPrecondition(f"{self.base_url} answered with no choices", field=FIELD)
        return exps

    # --- ModelWrapper's API ----------------------------------------------------------------------

    def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> list[Experience]:
        kwargs.pop("template_kwargs", None)
        body = {"messages": messages, **self.sampling(**kwargs), **({"tools": tools} if tools else {})}
        return self._experiences(self._post("/chat/completions", body), "", messages, chat=True)

    async def chat_async(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[Experience]:
        return await asyncio.to_thread(self.chat, messages, **kwargs)

    def generate(self, prompts: list[str] | str, **kwargs: Any) -> list[Experience]:
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        exps = []
        for text in texts:
            reply = self._post("/completions", {"prompt": text, **self.sampling(**kwargs)})
            exps.extend(self._experiences(reply, text, [{"role": "user", "content": text}], chat=False))
        return exps

    async def generate_async(self, prompts: list[str] | str, **kwargs: Any) -> list[Experience]:
        return await asyncio.to_thread(self.generate, prompts, **kwargs)

    def generate_tokens(self, prompt_ids: list[int], **kwargs: Any) -> list[Experience]:
        raise FailedPrecondition(
            f"{FIELD}: a remote chat API takes no token-id prompts; this workflow needs a local model_path",
            field=f"{FIELD}.enable",
        )

    async def generate_tokens_async(self, prompt_ids: list[int], **kwargs: Any) -> list[Experience]:
        return self.generate_tokens(prompt_ids, **kwargs)

    def logprobs(self, tokens: list[int], temperature: float = 1.0) -> np.ndarray:
        raise FailedPrecondition(
            f"{FIELD}: a remote chat API returns no logprobs of given tokens; this workflow needs a local model_path",
            field=f"{FIELD}.enable",
        )

    def get_openai_client(self) -> Any:
        """An `openai.OpenAI` client on the remote API itself (needs the openai package)."""
        import openai

        client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key or "EMPTY")
        client.model_path = self.model_name  # type: ignore[attr-defined]  # Trinity's attribute
        return client

    def get_openai_async_client(self) -> Any:
        import openai

        client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key or "EMPTY")
        client.model_path = self.model_name  # type: ignore[attr-defined]
        return client

    def close(self) -> None:
        """Nothing held: every request opens its own connection."""
