"""Dataset rows -> Experiences, with the trainer's tokenizer (the buffer never tokenizes).

The row's kind comes from its columns and the buffer's `format`:
- a preference pair (DPO): the row has both chosen_key and rejected_key; the prompt is built as
  below and chosen / rejected are strings or message lists ending with an assistant message;
  Experience(tokens = prompt, chosen, rejected);
- messages (prompt_type messages): the chat template over row[messages_key] with the row's tools
  (tools_key) when it has them; the last assistant turn is the response, or with
  enable_concatenated_multi_turn every assistant turn is trained on (action mask 1 on the
  assistant turns' tokens, 0 on the user / tool turns between them);
- plaintext: prompt = [system prompt] + row[prompt_key] (+ reply_prefix), response = row[response_key];
- text (algorithm_type cpt, `text_row`): row[text_key] is one document and every token of it is
  trained on. A causal model predicts each token from the ones before, so the sequence starts with
  the tokenizer's BOS token as the context of the first text token (prompt_length 1, the text and
  its EOS the response); a tokenizer without BOS leaves the first text token as the context.

Messages are rendered with the chat template of `chat` (the buffer's format.chat_template, else
model.custom_chat_template, else the tokenizer's) and its enable_thinking (format.enable_thinking, else
model.enable_thinking), as the explorer renders its prompts.

A response from a string gets an EOS token so the model learns to stop; a response the chat
template renders keeps the template's own end-of-turn tokens. Rows have no generating policy:
model_version 0, no logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from services.common.config.buffer import FormatConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience


@dataclass(frozen=True)
class ChatStyle:
    """How messages become text: a chat template (None: the tokenizer's) and its enable_thinking."""

    template: str | None = None
    enable_thinking: bool | None = None

    @classmethod
    def of(cls, fmt: FormatConfig, model_template: str | None, model_thinking: bool | None) -> ChatStyle:
        """The buffer's format over the model's settings (model.custom_chat_template / enable_thinking)."""
        thinking = fmt.enable_thinking if fmt.enable_thinking is not None else model_thinking
        return cls(fmt.chat_template or model_template, thinking)

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.template is None else {"chat_template": self.template}
        return out if self.enable_thinking is None else {**out, "enable_thinking": self.enable_thinking}


def tokenize_row(
    row: dict[str, Any], fmt: FormatConfig, tokenizer: Any, *, where: str, chat: ChatStyle = ChatStyle()
) -> Experience:
    """One dataset row -> Experience (see the module docstring for the three kinds)."""
    if fmt.chosen_key in row and fmt.rejected_key in row:
        return _pair(row, fmt, tokenizer, where, chat)
    if fmt.prompt_type == "messages":
        messages = _messages(row, fmt, where, must_end_with_assistant=True)
        tools = _tools(row, fmt)
        if fmt.enable_concatenated_multi_turn:
            return _all_turns(messages, tools, tokenizer, where, chat)
        prompt_ids = chat_ids(tokenizer, messages[:-1], generation_prompt=True, tools=tools, chat=chat)
        return _experience(prompt_ids, _with_eos(tokenizer, messages[-1]["content"]), "", where)
    prompt_text = _plain_prompt(row, fmt, where, answer_key=fmt.response_key)
    prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
    return _experience(prompt_ids, _with_eos(tokenizer, str(row[fmt.response_key])), prompt_text, where)


def text_row(row: dict[str, Any], fmt: FormatConfig, tokenizer: Any, *, where: str) -> Experience:
    """One plain text row (continued pre-training) -> Experience trained on every token after the
    first position: [BOS] + text + [EOS], prompt_length 1 (see the module docstring)."""
    text = row.get(fmt.text_key)
    if not isinstance(text, str) or not text:
        raise InvalidArgument(
            f"row has no text in {fmt.text_key!r} (keys: {sorted(row)}); set format.text_key to the column "
            "that holds the documents",
            field=where,
        )
    ids = _with_eos(tokenizer, text)
    bos = tokenizer.bos_token_id
    tokens = [int(bos), *ids] if bos is not None else ids
    if len(tokens) < 2:
        raise InvalidArgument(
            "the text is one token and the tokenizer has no BOS or EOS token, so nothing is left to predict",
            field=where,
        )
    return Experience(tokens=np.asarray(tokens, dtype=np.int64), prompt_length=1, model_version=0)


def chat_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    generation_prompt: bool,
    tools: Any,
    chat: ChatStyle = ChatStyle(),
) -> list[int]:
    """The chat template rendered to text, then tokenized without special tokens (as the explorer does)."""
    extra = {**chat.kwargs(), **({"tools": tools} if tools else {})}
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, **extra
    )
    return [int(t) for t in tokenizer.encode(str(text), add_special_tokens=False)]


def _messages(
    row: dict[str, Any], fmt: FormatConfig, where: str, *, must_end_with_assistant: bool
) -> list[dict[str, Any]]:
    value = row.get(fmt.messages_key)
    messages: list[dict[str, Any]] = value if isinstance(value, list) else []
    ok = bool(messages) and all(isinstance(m, dict) for m in messages)
    if not ok or (must_end_with_assistant and messages[-1].get("role") != "assistant"):
        ending = " ending with an assistant message" if must_end_with_assistant else ""
        raise InvalidArgument(f"{fmt.messages_key!r} must be a list of messages{ending}", field=where)
    return list(messages)


def _tools(row: dict[str, Any], fmt: FormatConfig) -> Any:
    return row.get(fmt.tools_key) or None


def _plain_prompt(row: dict[str, Any], fmt: FormatConfig, where: str, *, answer_key: str) -> str:
    if fmt.prompt_key not in row or answer_key not in row:
        raise InvalidArgument(
            f"row has no {fmt.prompt_key!r} / {answer_key!r} (keys: {sorted(row)}); set format.prompt_key "
            "and the answer's key",
            field=where,
        )
    system = row.get(fmt.system_prompt_key) if fmt.system_prompt_key else fmt.system_prompt
    return (f"{system}\n" if system else "") + str(row[fmt.prompt_key]) + (fmt.reply_prefix or "")


def _with_eos(tokenizer: Any, text: str) -> list[int]:
    ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    eos = tokenizer.eos_token_id
    return [*ids, int(eos)] if eos is not None else ids


def _experience(prompt_ids: list[int], response_ids: list[int], prompt_text: str, where: str) -> Experience:
    if not response_ids:
        raise InvalidArgument("the response is empty", field=where)
    tokens = np.asarray([*prompt_ids, *response_ids], dtype=np.int64)
    return Experience(tokens=tokens, prompt_length=len(prompt_ids), model_version=0, prompt_text=prompt_text)


def _all_turns(
    messages: list[dict[str, Any]], tools: Any, tokenizer: Any, where: str, chat: ChatStyle
) -> Experience:
    """enable_concatenated_multi_turn: the whole conversation, trained on every assistant turn."""
    full = chat_ids(tokenizer, messages, generation_prompt=False, tools=tools, chat=chat)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = (
            chat_ids(tokenizer, messages[:i], generation_prompt=True, tools=tools, chat=chat) if i else []
        )
        upto = chat_ids(tokenizer, messages[: i + 1], generation_prompt=False, tools=tools, chat=chat)
        if upto[: len(before)] != before or full[: len(upto)] != upto:
            raise InvalidArgument(
                f"the chat template does not render message {i} as a continuation of the turns before it, "
                "so its tokens cannot be found in the whole conversation; enable_concatenated_multi_turn "
                "needs a template that renders turns in order (or set it false: the last turn only)",
                field=where,
            )
        spans.append((len(before), len(upto)))
    start = spans[0][0]
    mask = np.zeros(len(full) - start, dtype=bool)
    for a, b in spans:
        mask[a - start : b - start] = True
    if not mask.any():
        raise InvalidArgument("the assistant turns render to no tokens", field=where)
    return Experience(
        tokens=np.asarray(full, dtype=np.int64), prompt_length=start, model_version=0, action_mask=mask
    )


def _pair(row: dict[str, Any], fmt: FormatConfig, tokenizer: Any, where: str, chat: ChatStyle) -> Experience:
    """A preference pair: the prompt's tokens, and the chosen / rejected responses' tokens."""
    if fmt.prompt_type == "messages":
        prompt = _messages(row, fmt, where, must_end_with_assistant=False)
        prompt_ids = chat_ids(tokenizer, prompt, generation_prompt=True, tools=_tools(row, fmt), chat=chat)
        prompt_text = ""
    else:
        prompt_text = _plain_prompt(row, fmt, where, answer_key=fmt.chosen_key)
        prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
    if not prompt_ids:
        raise InvalidArgument("the prompt is empty", field=where)
    answers = []
    for key in (fmt.chosen_key, fmt.rejected_key):
        value = row[key]
        if isinstance(value, list):  # messages: the last one is the assistant's answer
            if not value or not isinstance(value[-1], dict) or value[-1].get("role") != "assistant":
                raise InvalidArgument(
                    f"{key!r} must be a string or messages ending with an assistant one", field=where
                )
            value = value[-1].get("content", "")
        ids = _with_eos(tokenizer, str(value))
        if len(ids) <= (1 if tokenizer.eos_token_id is not None else 0):
            raise InvalidArgument(f"the {key!r} response is empty", field=where)
        answers.append(np.asarray(ids, dtype=np.int64))
    return Experience(
        tokens=np.asarray(prompt_ids, dtype=np.int64),
        prompt_length=0,
        model_version=0,
        prompt_text=prompt_text,
        chosen=answers[0],
        rejected=answers[1],
    )
