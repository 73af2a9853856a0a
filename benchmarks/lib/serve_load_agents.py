"""The agents of benchmarks/serve_load.py: concurrent two-turn sessions against the proxy, and the
same token traffic straight to a bare engine (the latency baseline).

A session: a question (`a+b=`), the model's answer, a follow-up that extends the history (the
second request sends question, answer and `?`), a reward (the share of digits in the last reply:
rarely equal within a group, so GRPO has something to learn), POST /feedback, POST /commit. Sessions
are handed out in groups of `group` per task id (`q<n>`), a task's remaining sessions even after
the deadline, so every task ends with a whole GRPO group. Each completion carries an
Idempotency-Key (`<session>-t<turn>`): a retry whose answer was lost gets the recorded response.

Retried with backoff (0.1 s doubling to 2 s) and counted by kind: connection refused / reset /
dropped, timeouts, 502-504, 429 (the proxy's concurrency limit) and 409 `idempotency_key_in_use`.
Any other error is a failure: recorded with its body, never retried; so is a request still
refused after GIVE_UP_S of retries (a wedged proxy ends the run instead of hanging it).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

FOLLOW_UP = "?"
GIVE_UP_S = 180.0
RETRYABLE_STATUS = {502: "http_502", 503: "http_503", 504: "http_504", 429: "limit_429"}


@dataclass
class Tally:
    """What the agents saw: latencies of successful attempts by route, retries, failures, acks."""

    latency: dict[str, list[float]] = field(
        default_factory=lambda: {"chat": [], "feedback": [], "commit": []}
    )
    retries: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    acked: dict[str, list[str]] = field(default_factory=dict)
    """session id -> the response ids its agent got (turn 1, turn 2), once /commit answered 200."""
    versions: Counter[int] = field(default_factory=Counter)
    sessions: int = 0


class Tasks:
    """Hands out (task id, session id, question): `group` sessions per task, new tasks until the deadline."""

    def __init__(self, group: int, seed: int, prefix: str = "") -> None:
        self.group, self.prefix = group, prefix
        self.rng = random.Random(seed)
        self.task = -1
        self.left = 0
        self.question = ""
        self.deadline = 0.0

    def next(self) -> tuple[str, str, str] | None:
        if self.left == 0:
            if time.monotonic() >= self.deadline:
                return None
            self.task += 1
            self.left = self.group
            self.question = f"{self.rng.randint(0, 99)}+{self.rng.randint(0, 99)}="
        self.left -= 1
        task = f"{self.prefix}q{self.task}"
        return task, f"{task}-r{self.group - 1 - self.left}", self.question


def reward_of(reply: str) -> float:
    return round(sum(c.isdigit() for c in reply) / max(1, len(reply)), 4)


def retry_kind(exc: BaseException) -> str | None:
    """The counter of a retryable client error (None: not retryable)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connection_refused"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "disconnected"
    if isinstance(exc, (aiohttp.ClientOSError, aiohttp.ClientPayloadError)):
        return "connection_reset"
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    return None


class Agent:
    """One agent: sessions one after another until the task source runs dry."""

    def __init__(
        self, http: aiohttp.ClientSession, url: str, tasks: Tasks, tally: Tally, max_tokens: int
    ) -> None:
        self.http, self.url, self.tasks, self.tally, self.max_tokens = http, url, tasks, tally, max_tokens

    async def call(
        self, route: str, body: dict[str, Any], headers: dict[str, str], what: str
    ) -> dict[str, Any] | None:
        """POST until an answer that is not retryable; the JSON of a 200, else None (a failure)."""
        delay, first = 0.1, time.perf_counter()
        while True:
            started = time.perf_counter()
            if started - first > GIVE_UP_S:
                self.tally.failures.append(
                    f"{route} {headers}: still refused after {GIVE_UP_S:.0f} s of retries"
                )
                return None
            try:
                async with self.http.post(self.url + route, json=body, headers=headers) as response:
                    payload = await response.json(content_type=None)
                    status = response.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                kind = retry_kind(exc)
                if kind is None:
                    self.tally.failures.append(f"{route} {headers}: {type(exc).__name__}: {exc}")
                    return None
                self.tally.retries[kind] += 1
            else:
                if status == 200:
                    self.tally.latency[what].append(time.perf_counter() - started)
                    return dict(payload)
                code = (payload.get("error") or {}).get("code") if isinstance(payload, dict) else None
                kind = RETRYABLE_STATUS.get(status) or (
                    "key_in_use_409" if code == "idempotency_key_in_use" else None
                )
                if kind is None:
                    self.tally.failures.append(f"{route} {headers}: HTTP {status}: {payload}")
                    return None
                self.tally.retries[kind] += 1
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)

    async def chat(self, sid: str, turn: int, messages: list[dict[str, str]]) -> dict[str, Any] | None:
        body = {"model": "m", "messages": messages, "max_tokens": self.max_tokens}
        headers = {"X-Session-Id": sid, "Idempotency-Key": f"{sid}-t{turn}"}
        reply = await self.call("/v1/chat/completions", body, headers, "chat")
        if reply is not None:
            self.tally.versions[int(reply["model_version"])] += 1
        return reply

    async def session(self, task: str, sid: str, question: str) -> None:
        messages = [{"role": "user", "content": question}]
        first = await self.chat(sid, 1, messages)
        if first is None:
            return
        said = first["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": said}, {"role": "user", "content": FOLLOW_UP}]
        second = await self.chat(sid, 2, messages)
        if second is None:
            return
        reward = reward_of(second["choices"][0]["message"]["content"])
        body = {"session_id": sid, "reward": reward, "task_id": task}
        if await self.call("/feedback", body, {}, "feedback") is None:
            return
        if await self.call("/commit", {"session_id": sid}, {}, "commit") is not None:
            self.tally.acked[sid] = [first["id"], second["id"]]
            self.tally.sessions += 1

    async def run(self) -> None:
        while (job := self.tasks.next()) is not None:
            await self.session(*job)


async def run_agents(
    url: str, agents: int, tasks: Tasks, seconds: float, tally: Tally, max_tokens: int
) -> None:
    """`agents` agents for `seconds` (then each finishes its session and its task's group)."""
    tasks.deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await asyncio.gather(*(Agent(http, url, tasks, tally, max_tokens).run() for _ in range(agents)))


async def run_bare(
    engine: Any, tokenizer: Any, agents: int, seconds: float, max_tokens: int, seed: int
) -> list[float]:
    """The agents' token traffic straight to `engine` (a BatchingEngine): per session the question's
    ids, then question + answer + follow-up ids, as the proxy gives its engine. Latency of each call."""
    from services.explorer.engines.base import SamplingParams
    from services.explorer.text import encode_plain

    params = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    follow = encode_plain(tokenizer, FOLLOW_UP)
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    out: list[float] = []

    async def agent() -> None:
        while time.monotonic() < deadline:
            ids = encode_plain(tokenizer, f"{rng.randint(0, 99)}+{rng.randint(0, 99)}=")
            for _turn in range(2):
                started = time.perf_counter()
                [[reply]] = await engine.generate_async([ids], params)
                out.append(time.perf_counter() - started)
                ids = [*ids, *(int(t) for t in reply.response_ids), *follow]

    await asyncio.gather(*(agent() for _ in range(agents)))
    return out
