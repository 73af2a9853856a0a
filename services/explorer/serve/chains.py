"""How a session's completions become experiences: linking turns, assistant-only masks (pure).

An agent sends its whole conversation on every request. Each completion choice is a *turn*: the
token ids the engine was given (`prompt_ids`), the ids it sampled with their logprobs, the model
version, and two texts: the conversation rendered by the chat template (`context_text`) and the
reply as a template writes it back (`reply_text`, special tokens included).

A request *extends* turn T when its rendered conversation starts with T's conversation followed by
T's reply: with its special tokens, without its final end-of-sequence token (some templates drop
it), or as the agent got it (special tokens sampled inside the reply are not in its text). The
engine is then given T's ids, T's sampled ids and only the new text (tool results, the next user
message, the generation prompt) tokenized: what was sampled is never re-tokenized. A request that
extends no turn of its session starts a new chain: the agent rewrote its history (edited or dropped
messages, or its template renders past turns differently), counted as a split.

Each chain from a root to a leaf (a turn no other turn extends) is one experience: the root's
prompt is the prompt, everything after it the response, with action mask 1 and the engine's
logprobs on sampled tokens and 0 on the text between turns. Its model version is the oldest of its
turns (a version changed between turns: the staleness bound errs on the safe side). Its rewards
(turn_rewards): each turn's feedback at that turn's last sampled token (`token_level_rewards`), the
session's at the chain's last, the experience's `reward` their sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.experience import Experience


@dataclass
class Turn:
    """One choice of one completion, as recorded (history.py stores it)."""

    turn_id: str
    """`<response id>/<choice index>`."""
    response_id: str
    session_id: str
    parent_id: str | None
    prompt_ids: np.ndarray
    """int64: what the engine was given."""
    response_ids: np.ndarray
    """int64: what it sampled (the EOS token included when it stopped on one)."""
    logprobs: np.ndarray
    """float32, one per sampled token."""
    version: int
    context_text: str
    reply_text: str
    """The sampled ids decoded with special tokens (how a template writes the reply back)."""
    reply_open_text: str | None = None
    """The same without its final EOS token (None when the reply did not end on one)."""
    response_text: str = ""
    """The reply without special tokens (what the agent got)."""
    finish_reason: str = "stop"
    messages: list[dict[str, Any]] = field(default_factory=list)
    sampling: tuple[float, float, int] = (1.0, 1.0, 0)
    """(temperature, top_p, top_k) it was sampled with: its logprobs are under that distribution."""

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True)
class Link:
    """Where a new request goes: after `parent` with `new_text` tokenized, or a new chain (parent None)."""

    parent: Turn | None
    new_text: str


def link(turns: list[Turn], context_text: str) -> Link:
    """The turn a request with this rendered conversation extends: the one whose conversation plus
    reply is the longest prefix of it (None: a new chain, its whole text to tokenize)."""
    best: tuple[int, Turn, str] | None = None
    for turn in turns:
        if not context_text.startswith(turn.context_text):
            continue
        rest = context_text[len(turn.context_text) :]
        for reply in (turn.reply_text, turn.reply_open_text, turn.response_text):
            if reply is None or not rest.startswith(reply):
                continue
            matched = len(turn.context_text) + len(reply)
            if best is None or matched > best[0]:
                best = (matched, turn, rest[len(reply) :])
    if best is None:
        return Link(None, context_text)
    return Link(best[1], best[2])


def chain(turn: Turn, by_id: dict[str, Turn]) -> list[Turn]:
    """The turns from the root of `turn`'s chain to `turn`."""
    out = [turn]
    while out[-1].parent_id is not None:
        out.append(by_id[out[-1].parent_id])
    return out[::-1]


def leaves(turns: list[Turn]) -> list[Turn]:
    """Turns no other turn extends, in recording order."""
    parents = {t.parent_id for t in turns}
    return [t for t in turns if t.turn_id not in parents]


@dataclass(frozen=True)
class ResponseReward:
    """The feedback of one response (history.REWARDS)."""

    reward: float
    feedback: str
    """The /feedback call that gave it: a call that names several responses of one chain counts once."""


def turn_rewards(
    path: list[Turn], response_rewards: dict[str, ResponseReward], session_reward: float | None
) -> list[float] | None:
    """The reward each turn of a chain receives at its last sampled token (None: the chain has none).

    Each /feedback call that names responses on the path gives its reward once, to the latest turn
    it names (Trinity's clients name every response of an episode in one call: one reward, at the
    end); calls naming different turns give each of them its own. The session's reward goes to the
    chain's last turn, added to what that turn has. The chain's reward is the sum of its turns'.
    """
    latest: dict[str, tuple[int, float]] = {}  # feedback call -> (latest turn it names, reward)
    for i, turn in enumerate(path):
        got = response_rewards.get(turn.response_id)
        if got is not None:
            latest[got.feedback] = (i, got.reward)
    if not latest and session_reward is None:
        return None
    placed = [0.0] * len(path)
    for i, reward in latest.values():
        placed[i] += reward
    if session_reward is not None:
        placed[-1] += session_reward
    return placed


def build_experience(path: list[Turn], rewards: list[float] | None = None) -> Experience:
    """One chain as an experience: the root's prompt, then every token after it, sampled or not.
    `rewards` (turn_rewards): each turn's at its last sampled token (token_level_rewards), their sum
    the experience's reward."""
    root, leaf = path[0], path[-1]
    tokens = np.concatenate([leaf.prompt_ids, leaf.response_ids]).astype(np.int64)
    prompt_length = len(root.prompt_ids)
    size = len(tokens) - prompt_length
    mask = np.zeros(size, dtype=bool)
    logprobs = np.zeros(size, dtype=np.float32)
    token_rewards = np.zeros(size, dtype=np.float32)
    for i, turn in enumerate(path):
        start = len(turn.prompt_ids) - prompt_length
        end = start + len(turn.response_ids)
        if not np.array_equal(tokens[prompt_length + start : prompt_length + end], turn.response_ids):
            raise ValueError(f"turn {turn.turn_id} is not a prefix of the chain of {leaf.turn_id}")
        mask[start:end] = True
        logprobs[start:end] = turn.logprobs
        if rewards is not None and rewards[i] != 0.0:
            if end == start:
                raise ValueError(f"turn {turn.turn_id} sampled no token to place its reward {rewards[i]} on")
            token_rewards[end - 1] += rewards[i]
    info: dict[str, Any] = {
        "session_id": leaf.session_id,
        "response_ids": [t.response_id for t in path],
        "turns": len(path),
        "model_versions": [t.version for t in path],
        "finish_reason": leaf.finish_reason,
    }
    if rewards is not None:
        info["turn_rewards"] = list(rewards)
    return Experience(
        tokens=tokens,
        prompt_length=prompt_length,
        model_version=min(t.version for t in path),
        logprobs=logprobs,
        action_mask=mask,
        prompt_text=root.context_text,
        response_text=leaf.response_text,
        reward=None if rewards is None else float(sum(rewards)),
        token_level_rewards=None if rewards is None else token_rewards,
        info=info,
    )


def session_experiences(
    turns: list[Turn], response_rewards: dict[str, ResponseReward], session_reward: float | None
) -> tuple[list[Experience], int]:
    """(the rewarded chains as experiences, the chains without a reward) of one session."""
    by_id = {t.turn_id: t for t in turns}
    out, unrewarded = [], 0
    for leaf in leaves(turns):
        path = chain(leaf, by_id)
        rewards = turn_rewards(path, response_rewards, session_reward)
        if rewards is None:
            unrewarded += 1
            continue
        out.append(build_experience(path, rewards))
    return out, unrewarded
