"""`frozen_lake_workflow`: Trinity-RFT's FrozenLakeWorkflow, a concatenated multi-turn game.

Each run plays one episode on the task's lake and returns one experience holding the whole chat:
the first system + user turn is the prompt; every reply the model sampled follows with action mask
1 and its sampling logprobs; the chat template's text between a reply and the next generation
prompt (end of turn, the next user message, the assistant header) follows with action mask 0 and
logprob 0. The model's tokens are kept as sampled, never re-tokenized: each turn's context is the
previous context plus those tokens (token in, token out), and the template text around a new user
message is found by rendering the chat with a placeholder reply.

The lake (services/explorer/workflows/frozen_lake_env.py) comes from `workflow_args.desc` (rows of
S/F/H/G) or is generated from the task row's `size` (4; Trinity's default of 1 admits no map), `p`
(tile frozen probability, 0.8) and `seed` (42, which also seeds the slips): the same map and slips
as Trinity's for the same row. The reward is 1.0 when the player reaches the goal, else 0
(Trinity's sum of step rewards). `workflow_args` (Trinity's names and defaults):
- `env_max_steps` (8): the generated map has a path to the goal within this many moves;
- `agent_max_steps` (10): model turns per episode; `max_steps`, Trinity's earlier name, sets both;
- `is_slippery` (false): a move goes the intended way or a perpendicular one, 1/3 each;
- `use_multistep_prompt` (false): the system prompt with five worked examples;
- `reward_fn_type` / `reward_fn_args`: a registered reward fn that scores the whole chat instead
  (called with `response` = last reply and `messages`; its `reward` part replaces the game's).
`format.system_prompt`, when set, replaces the system prompt ("" for none). The whole response
(replies and inserted text) stays within `rollout_args.max_response_tokens` (default the model's
max_response_tokens) and each turn's context within the model's max_prompt_tokens; an episode that
runs out of room ends there, with info `truncate_status: response_truncated`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument
from services.common.experience import ChatMessage, Experience
from services.common.logging import get_logger
from services.explorer.rewards import REWARD_FUNCTIONS, resolve_reward
from services.explorer.workflows.base import ResettableWorkflow, Task
from services.explorer.workflows.frozen_lake_env import lake_of_task, parse_action
from services.explorer.workflows.frozen_lake_prompts import (
    MULTI_SHOT_SYSTEM_PROMPT,
    SYSTEM_PROMPT,
    user_turn,
)

log = get_logger("explorer.workflows.frozen_lake")

_REPLY_MARK = "<<frozen-lake-reply>>"


def turn_continuation(model: Any, messages: list[dict[str, str]]) -> str:
    """The template text after the last reply in `messages` (…, assistant, user) up to the next generation prompt."""
    probe = [*messages[:-2], {"role": "assistant", "content": _REPLY_MARK}, messages[-1]]
    text = model.render_chat(probe)
    cut = text.rfind(_REPLY_MARK)
    if cut < 0:
        raise InvalidArgument(
            "the chat template drops the assistant's reply, so the conversation cannot be extended "
            "turn by turn; use a template that renders every message (model.custom_chat_template)",
            field="model.custom_chat_template",
        )
    return text[cut + len(_REPLY_MARK) :]


@dataclass
class Episode:
    """Token ids of one concatenated chat; the lists past `prompt_length` cover the response only."""

    prompt_text: str = ""
    tokens: list[int] = field(default_factory=list)
    prompt_length: int = 0
    logprobs: list[float] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)  # response text, reply by reply and insert by insert

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    def start(self, text: str, ids: list[int]) -> None:
        self.prompt_text, self.tokens, self.prompt_length = text, list(ids), len(ids)

    def add_reply(self, ids: list[int], logprobs: list[float], text: str) -> None:
        self.tokens += ids
        self.logprobs += logprobs
        self.mask += [True] * len(ids)
        self.pieces.append(text)

    def add_inserted(self, ids: list[int], text: str) -> None:
        self.tokens += ids
        self.logprobs += [0.0] * len(ids)
        self.mask += [False] * len(ids)
        self.pieces.append(text)

    def drop_inserted(self, count: int) -> None:
        """Undo the last add_inserted, which added `count` tokens."""
        if count:
            del self.tokens[-count:], self.logprobs[-count:], self.mask[-count:]
        self.pieces.pop()


class FrozenLakeWorkflow(ResettableWorkflow):
    """See the module docstring. One episode per run; resettable (the lake is rebuilt per task)."""

    is_async = True

    def reset(self, task: Task) -> None:
        self.task = task
        args, raw = task.workflow_args, task.raw_task
        legacy_steps = args.get("max_steps")
        self.env_max_steps = int(args.get("env_max_steps", legacy_steps if legacy_steps is not None else 8))
        self.agent_max_steps = int(
            args.get("agent_max_steps", legacy_steps if legacy_steps is not None else 10)
        )
        if self.agent_max_steps < 1:
            raise InvalidArgument(
                f"agent_max_steps must be >= 1, got {self.agent_max_steps}",
                field="workflow_args.agent_max_steps",
            )
        self.lake, self.seed = lake_of_task(args, raw, self.env_max_steps)
        system = task.format_args.system_prompt
        if system is None:
            system = MULTI_SHOT_SYSTEM_PROMPT if args.get("use_multistep_prompt", False) else SYSTEM_PROMPT
        self.system_prompt = system
        self.reward_fn = None
        if args.get("reward_fn_type"):
            spec = REWARD_FUNCTIONS.get(str(args["reward_fn_type"]), field="workflow_args.reward_fn_type")
            self.reward_fn = resolve_reward(spec, dict(args.get("reward_fn_args") or {}))
        rollout = dict(task.rollout_args)
        budget = rollout.pop("max_response_tokens", None)
        self.max_response_tokens = int(budget if budget is not None else self.model.max_response_tokens)
        self.sampling = {k: v for k, v in rollout.items() if k != "logprobs"} | {"n": 1}

    def _extend(self, messages: list[dict[str, str]], episode: Episode, last_reply: Experience | None) -> int:
        """Append the newest user turn's tokens; returns how many were inserted into the response."""
        if last_reply is None:
            text = self.model.render_chat(messages)
            episode.start(text, self.model.tokenize(text))
            return 0
        text = turn_continuation(self.model, messages)
        ids = self.model.tokenize(text)
        # a reply that stopped on the end-of-turn token already holds the template's first token
        if (
            ids
            and last_reply.info.get("finish_reason") == "stop"
            and episode.tokens[-1] == ids[0]
            and episode.mask[-1]
        ):
            ids = ids[1:]
        episode.add_inserted(ids, text)
        return len(ids)

    async def run_async(self) -> list[Experience]:
        observation = self.lake.reset(self.seed)
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        episode, rewards = Episode(), []
        reply: Experience | None = None
        steps, done, previous, truncated = 0, False, None, False
        version = self.model.model_version
        for _ in range(self.agent_max_steps):
            messages.append(
                {
                    "role": "user",
                    "content": user_turn(
                        steps,
                        observation,
                        unchanged=previous == observation,
                        steps_left=self.agent_max_steps - steps,
                    ),
                }
            )
            inserted = self._extend(messages, episode, reply)
            room = self.max_response_tokens - episode.response_length
            if reply is not None and (room <= 0 or len(episode.tokens) > self.model.max_prompt_tokens):
                messages.pop()
                episode.drop_inserted(inserted)
                rewards.append(0.0)
                truncated = True
                break
            limit = self.sampling.get("max_tokens")
            sampling = {**self.sampling, "max_tokens": room if limit is None else min(room, int(limit))}
            reply = (await self.model.generate_tokens_async(episode.tokens, **sampling))[0]
            version = reply.model_version
            episode.add_reply(
                reply.tokens[reply.prompt_length :].tolist(),
                np.asarray(reply.logprobs).tolist(),
                reply.response_text,
            )
            messages.append({"role": "assistant", "content": reply.response_text})
            result = self.lake.step(parse_action(reply.response_text))
            previous, observation = observation, result.observation
            rewards.append(result.reward)
            steps, done = steps + 1, result.done
            if done:
                break
        return [self._experience(episode, messages, rewards, steps, done, truncated, version)]

    def _score(self, messages: list[dict[str, str]], game_reward: float) -> float:
        if self.reward_fn is None:
            return game_reward
        last = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
        try:
            return float(self.reward_fn(response=last, messages=messages).get("reward", game_reward))
        except Exception as exc:  # noqa: BLE001 - Trinity falls back to the game's reward
            log.warning("frozen_lake_reward_fn_failed", error=f"{type(exc).__name__}: {exc}")
            return game_reward

    def _experience(
        self,
        episode: Episode,
        messages: list[dict[str, str]],
        rewards: list[float],
        steps: int,
        done: bool,
        truncated: bool,
        version: int,
    ) -> Experience:
        reward = self._score(messages, float(sum(rewards)))
        info: dict[str, Any] = {"env_steps": steps, "env_done": int(done), "test_score": reward}
        if truncated:
            info["truncate_status"] = "response_truncated"
        reached = self.lake.tile() == "G"
        return Experience(
            tokens=np.asarray(episode.tokens, dtype=np.int64),
            prompt_length=episode.prompt_length,
            model_version=version,
            reward=reward,
            logprobs=np.asarray(episode.logprobs, dtype=np.float32),
            action_mask=np.asarray(episode.mask, dtype=bool),
            metrics={"env_steps": float(steps), "env_done": float(done), "accuracy": float(reached)},
            info=info,
            messages=[ChatMessage(m["role"], m["content"]) for m in messages],
            prompt_text=episode.prompt_text,
            response_text="".join(episode.pieces),
        )
