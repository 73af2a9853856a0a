"""What the text-environment workflows share (text_env.py): action parsing and the chat trajectory's
tokens (template rendering kept exactly, the stop token never doubled)."""

from __future__ import annotations

from typing import Any

import numpy as np

from services.explorer.workflows.text_env import ChatTrajectory, parse_action
from tests.fakes.env_workflows import (
    LOGPROB,
    decode,
    model_text,
    other_text,
)

# --- shared pieces ---------------------------------------------------------------------------------


def test_parse_action_takes_the_first_tagged_command() -> None:
    assert parse_action("<think>look</think><action> go to cabinet 1 </action>") == "go to cabinet 1"
    assert parse_action("<action>open drawer 2</action><action>close it</action>") == "open drawer 2"
    assert parse_action("<action>open drawer 2") == "open drawer 2"  # no closing tag: the rest
    assert parse_action("go to cabinet 1") == ""


def test_trajectory_tokens_are_the_template_rendering_and_the_stop_token_is_not_doubled(
    make_model: Any,
) -> None:
    # a template that closes every turn with <eos> (as Qwen closes turns with <|im_end|>)
    template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}<eos>\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    model, scripted = make_model(["go north", "go south"], chat_template=template)
    trajectory = ChatTrajectory(model, [{"role": "user", "content": "start"}])
    first = trajectory.sample({"temperature": 1.0})
    trajectory.add_messages([{"role": "user", "content": "a wall"}])
    trajectory.sample({"temperature": 1.0})
    assert first is not None and first.response_text == "go north"
    # the reply's own <eos> is the template's end of turn: the tokens read as the rendered chat
    rendered = "[user]start<eos>\n[assistant]go north<eos>\n[user]a wall<eos>\n[assistant]go south<eos>"
    assert decode(model, trajectory.tokens) == rendered
    exp = trajectory.experience(1.0, {"env_done": 1})
    assert model_text(model, exp) == "go north<eos>go south<eos>"
    assert other_text(model, exp) == "\n[user]a wall<eos>\n[assistant]"
    assert exp.logprobs is not None and exp.action_mask is not None
    assert np.all(exp.logprobs[exp.action_mask] == LOGPROB) and np.all(exp.logprobs[~exp.action_mask] == 0)
    assert exp.metrics == {"env_done": 1.0}
    # the second call read exactly the trajectory so far
    assert decode(model, scripted.prompts[1]) == rendered[: -len("go south<eos>")]
