"""What the text-environment workflows (ALFWorld, ScienceWorld, WebShop) share.

- `parse_action`: their prompts ask for `<action>...</action>`; the text between the first such
  pair is the command sent to the environment ("" when the tag is missing).
- `ChatTrajectory`: a conversation kept as the token ids the model read and wrote. Each reply is
  appended exactly as sampled (action mask 1, its sampling logprobs); the chat template's text
  between a reply and the next generation prompt (end of turn, the next user turn, the assistant
  header) is appended as tokenized text (action mask 0, logprob 0). That text is found by
  rendering the chat with a placeholder in the reply's place, so templates that rewrite earlier
  turns (dropping old reasoning) still extend cleanly. One trajectory becomes one experience, as
  Trinity's concatenated multi-turn workflows make.
- `play_episode` / `play_game`: the loop those workflows run under their `Rules`: sample a reply,
  act on it, add the observation; `tagged_actions(env)` acts by sending the reply's <action> to a
  gym-style env.
- `EnvWorkflow`: their base: `preflight` adds `missing_data` to the package check, `__init__`
  calls `reset`; `missing_path` is the sentence for data that is not where it is looked for.

The environments are called synchronously, so these workflows implement `run()` and the runner
keeps them in a worker thread, off the explorer's event loop.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument
from services.common.experience import ChatMessage, Experience
from services.explorer.workflows.base import Task, Workflow

_REPLY_MARK = "<<env-workflow-reply>>"


def parse_action(response: str) -> str:
    """The command inside the first <action>...</action> ("" without an opening tag)."""
    if "<action>" not in response:
        return ""
    return response.split("<action>", 1)[1].split("</action>", 1)[0].strip()


def missing_path(workflow: str, what: str, path: str, how: str) -> str:
    """One preflight sentence: what data is missing, where it was looked for, how to get it."""
    return f"{workflow} needs {what}, and {path} does not exist ({how})"


class EnvWorkflow(Workflow):
    """A workflow over an environment with packages (`requires`) and data of its own."""

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        return [*super().preflight(workflow_args), *cls.missing_data(workflow_args)]

    @classmethod
    def missing_data(cls, workflow_args: dict[str, Any]) -> list[str]:
        """One sentence per piece of data the workflow cannot find (see `missing_path`)."""
        return []

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)


def sampling_args(task: Task) -> dict[str, Any]:
    """The task's rollout args for one reply per call (the runner repeats the run for n)."""
    return {**task.rollout_args.sampling(), "n": 1}


class ChatTrajectory:
    """One conversation as tokens (see the module docstring); grows reply, messages, reply, ..."""

    def __init__(self, model: Any, messages: list[dict[str, str]]) -> None:
        self.model = model
        self.messages = list(messages)
        self.prompt_text = model.render_chat(self.messages)
        self.tokens: list[int] = list(model.tokenize(self.prompt_text))
        self.prompt_length = len(self.tokens)
        self.logprobs: list[float] = []
        self.mask: list[bool] = []
        self.replies: list[Experience] = []
        self._open_reply: Experience | None = None  # the last reply, when nothing follows it yet

    def copy(self) -> ChatTrajectory:
        clone = copy.copy(self)
        clone.messages, clone.tokens = list(self.messages), list(self.tokens)
        clone.logprobs, clone.mask, clone.replies = list(self.logprobs), list(self.mask), list(self.replies)
        return clone

    @property
    def fits(self) -> bool:
        """Whether the context still fits the model's max_prompt_tokens."""
        return len(self.tokens) <= self.model.max_prompt_tokens

    def sample(self, sampling: dict[str, Any]) -> Experience | None:
        """One reply to the context, appended; None when the context no longer fits."""
        if not self.fits:
            return None
        reply: Experience = self.model.generate_tokens(self.tokens, **{**sampling, "n": 1})[0]
        self.add_reply(reply)
        return reply

    def add_reply(self, reply: Experience) -> None:
        """Append a reply's sampled tokens (from this context or, for a mirror, another one)."""
        ids = reply.tokens[reply.prompt_length :].tolist()
        self.tokens += ids
        self.mask += [True] * len(ids)
        self.logprobs += [0.0] * len(ids) if reply.logprobs is None else np.asarray(reply.logprobs).tolist()
        self.messages.append({"role": "assistant", "content": reply.response_text})
        self.replies.append(reply)
        self._open_reply = reply

    def add_messages(self, new: list[dict[str, str]]) -> None:
        """Append messages after the last reply: the template's text in between, action mask 0."""
        reply = self._open_reply
        if reply is None:
            raise InvalidArgument("a trajectory takes new messages only after a reply", field="messages")
        probe = [*self.messages[:-1], {"role": "assistant", "content": _REPLY_MARK}, *new]
        text = self.model.render_chat(probe)
        cut = text.rfind(_REPLY_MARK)
        if cut < 0:
            raise InvalidArgument(
                "the chat template drops the assistant's reply, so the conversation cannot be "
                "extended turn by turn; use a template that renders every message "
                "(model.custom_chat_template)",
                field="model.custom_chat_template",
            )
        ids = list(self.model.tokenize(text[cut + len(_REPLY_MARK) :]))
        # a reply that stopped on the end-of-turn token already holds the template's first token
        if ids and reply.info.get("finish_reason") == "stop" and self.tokens[-1] == ids[0]:
            ids = ids[1:]
        self.tokens += ids
        self.mask += [False] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.messages.extend(new)
        self._open_reply = None

    def experiences(self, reward: float, info: dict[str, Any]) -> list[Experience]:
        """[the experience], or [] when the model never replied (the first prompt did not fit)."""
        return [self.experience(reward, info)] if self.replies else []

    def experience(self, reward: float, info: dict[str, Any], *, keep_logprobs: bool = True) -> Experience:
        """The whole conversation as one experience; numeric `info` values become its metrics.

        keep_logprobs=False for a trajectory whose replies were sampled from another context (the
        trainer then recomputes them).
        """
        if not self.replies:
            raise InvalidArgument("the trajectory has no reply to train on", field="messages")
        return Experience(
            tokens=np.asarray(self.tokens, dtype=np.int64),
            prompt_length=self.prompt_length,
            model_version=self.replies[-1].model_version,
            reward=float(reward),
            logprobs=np.asarray(self.logprobs, dtype=np.float32) if keep_logprobs else None,
            action_mask=np.asarray(self.mask, dtype=bool),
            metrics=numeric_metrics(info),
            info=dict(info),
            messages=[ChatMessage(m["role"], m["content"]) for m in self.messages],
            prompt_text=self.prompt_text,
        )


def numeric_metrics(info: dict[str, Any]) -> dict[str, float]:
    """The int / float / bool values of `info`, as floats (Trinity keeps these as metrics)."""
    return {k: float(v) for k, v in info.items() if isinstance(v, (int, float))}


@dataclass
class Step:
    """One model call of an episode and what the environment made of it."""

    reply: Experience
    reward: float = 0.0
    done: bool = False
    acted: bool = True  # False when the workflow ended the episode instead of stepping the env


@dataclass
class Episode:
    """What `play_episode` returns: the steps in order; `done` when the environment said so."""

    steps: list[Step] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return bool(self.steps) and self.steps[-1].done

    @property
    def rounds(self) -> int:
        """Trinity's `env_rounds`: the index of the last loop round that ran (0 for none)."""
        return max(len(self.steps) - 1, 0)


# act(reply_text) -> (observation, reward, done), or None to end the episode without a step
Act = Callable[[str], tuple[str, float, bool] | None]


@dataclass(frozen=True)
class Rules:
    """How a game is played: the user turn showing an observation, the turn limit, sampling args."""

    format_observation: Callable[[str], str]
    max_steps: int
    sampling: dict[str, Any]

    def opening(self, system_prompt: str, observation: str) -> list[dict[str, str]]:
        """The chat before the first reply: the system prompt and the first observation."""
        return [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": self.format_observation(observation)},
        ]


def play_episode(
    trajectory: ChatTrajectory, act: Act, rules: Rules, *, mirror: ChatTrajectory | None = None
) -> Episode:
    """Up to `rules.max_steps` rounds of reply -> act -> next observation.

    `trajectory` already ends with the user turn of the first observation; each later observation
    is added as a user turn (to `mirror` too, which also receives every reply). The episode ends
    when the environment is done, `act` returns None, or the context no longer fits.
    """
    episode = Episode()
    for round_index in range(rules.max_steps):
        reply = trajectory.sample(rules.sampling)
        if reply is None:
            break
        if mirror is not None:
            mirror.add_reply(reply)
        outcome = act(reply.response_text)
        if outcome is None:
            episode.steps.append(Step(reply, acted=False))
            break
        observation, reward, done = outcome
        episode.steps.append(Step(reply, float(reward), bool(done)))
        if done or round_index == rules.max_steps - 1:
            break
        turn = {"role": "user", "content": rules.format_observation(observation)}
        for target in (trajectory, mirror):
            if target is not None:
                target.add_messages([turn])
    return episode


def tagged_actions(env: Any) -> Act:
    """Act by sending each reply's <action> to `env.step` (gym's obs, reward, done, info)."""

    def act(reply: str) -> tuple[str, float, bool]:
        observation, reward, done, _info = env.step(parse_action(reply))
        return observation, float(reward), bool(done)

    return act


def play_game(
    model: Any, system_prompt: str, observation: str, act: Act, rules: Rules
) -> tuple[ChatTrajectory, Episode]:
    """One episode of a chat that opens with `system_prompt` and the first observation."""
    trajectory = ChatTrajectory(model, rules.opening(system_prompt, observation))
    return trajectory, play_episode(trajectory, act, rules)
