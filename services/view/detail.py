"""Experiences decoded for display: tokens with the action mask, logprob stats, reward parts,
staleness, and the advantage the run's algorithm gives each row of its group.

Advantages are not stored with an experience unless its producer computed them (the trainer
computes them per batch). The viewer recomputes them with the trainer's own code
(services.trainer.algorithms.build_algorithm, services.trainer.batching.build_batch) over the
rows of the experience's group: exact for group-relative estimators (grpo, rloo, opmd, ...);
estimators that normalise over the whole batch or need critic values or reference logprobs give
other numbers or none, and the page says so.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.config import TrinityConfig
from services.common.errors import TrinityError
from services.common.experience import Experience
from services.common.wire import experience_from_proto
from services.view.tokens import Decoder
from trinity_grpc.common.v1 import common_pb2 as pb


@dataclass
class Token:
    """One token for display; kind: "p" prompt, "t" trained (action mask 1), "u" not trained."""

    id: int
    text: str
    kind: str
    logprob: float | None = None


@dataclass
class Shown:
    """One row of the index with its decoded payload."""

    row: dict[str, Any]
    exp: Experience | None = None
    error: str = ""
    prompt: list[Token] = field(default_factory=list)
    response: list[Token] = field(default_factory=list)
    logprob_mean: float | None = None
    logprob_min: float | None = None
    trained_tokens: int = 0
    advantage: float | None = None
    advantage_note: str = ""
    dropped: bool = False  # the advantage fn dropped the row (e.g. GRPO's std_threshold on a flat group)

    @property
    def staleness(self) -> int | None:
        """Versions between the weights that generated the row and those it was trained on."""
        trained = self.row.get("trained_step")
        return None if trained is None else int(trained) - 1 - int(self.row["model_version"])


def decode(row: dict[str, Any], payload: bytes | None, decoder: Decoder) -> Shown:
    shown = Shown(row)
    if payload is None:
        shown.error = "payload missing from the index"
        return shown
    try:
        exp = experience_from_proto(pb.Experience.FromString(payload), where=f"row {row['id']}")
    except Exception as exc:  # a corrupt payload is shown on its row, not raised
        shown.error = f"cannot decode: {exc}"
        return shown
    shown.exp = exp
    ids = [int(t) for t in exp.tokens]
    p = exp.prompt_length
    n = len(ids) - p
    mask = exp.action_mask if exp.action_mask is not None else np.ones(n, dtype=bool)
    logprobs = exp.logprobs if exp.logprobs is not None and len(exp.logprobs) == n else None
    prompt_text = decoder.pieces(ids[:p])
    response_text = decoder.pieces(ids[p:])
    shown.prompt = [Token(i, t, "p") for i, t in zip(ids[:p], prompt_text, strict=True)]
    shown.response = [
        Token(i, t, "t" if mask[k] else "u", None if logprobs is None else float(logprobs[k]))
        for k, (i, t) in enumerate(zip(ids[p:], response_text, strict=True))
    ]
    shown.trained_tokens = int(np.count_nonzero(mask))
    if logprobs is not None and shown.trained_tokens:
        trained = logprobs[np.asarray(mask, dtype=bool)]
        shown.logprob_mean, shown.logprob_min = float(trained.mean()), float(trained.min())
    if exp.advantages is not None and shown.trained_tokens:
        shown.advantage = float(np.asarray(exp.advantages)[np.asarray(mask, dtype=bool)].mean())
        shown.advantage_note = "given by the producer"
    return shown


class Advantages:
    """The run's advantage fn over whole groups; one built algorithm per stage config."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._algorithms: dict[str, Any] = {}  # by the algorithm section's JSON

    def fill(
        self, cfg: TrinityConfig | None, shown: list[Shown], groups: dict[str, list[Experience]]
    ) -> None:
        """Set `advantage` on every row without one, from its group's rows (`groups` by group_id)."""
        todo = [s for s in shown if s.exp is not None and s.advantage is None]
        if not todo:
            return
        if cfg is None:
            for s in todo:
                s.advantage_note = "no readable config: the algorithm is unknown"
            return
        if cfg.algorithm.advantage_fn in (None, "none"):
            for s in todo:
                s.advantage_note = f"{cfg.algorithm.algorithm_type} computes no advantage"
            return
        by_group: dict[str, list[Shown]] = defaultdict(list)
        for s in todo:
            by_group[s.row["group_id"]].append(s)
        for group_id, rows in by_group.items():
            members = groups.get(group_id) or []
            values, note = self._group(cfg, members)
            keys = [(e.task_id, e.run_id, e.step) for e in members]
            for s in rows:
                assert s.exp is not None
                key = (s.exp.task_id, s.exp.run_id, s.exp.step)
                s.advantage = values[keys.index(key)] if values is not None and key in keys else None
                s.dropped = values is not None and key in keys and s.advantage is None
                s.advantage_note = note

    def _algorithm(self, cfg: TrinityConfig) -> Any:
        import torch

        from services.trainer.algorithms import build_algorithm

        key = cfg.algorithm.model_dump_json()
        with self._lock:
            if key not in self._algorithms:
                # A group is a few rows: torch's intra-op thread pool costs more than it saves
                # (a [8, 32] max took 14 ms with 2 threads on a busy 2-core box, 9 us with 1).
                torch.set_num_threads(1)
                self._algorithms[key] = build_algorithm(cfg.algorithm)
            return self._algorithms[key]

    def _group(self, cfg: TrinityConfig, members: list[Experience]) -> tuple[list[float | None] | None, str]:
        if not members:
            return None, "the group's rows are not in the index"
        from services.trainer.batching import build_batch

        try:
            train = build_batch(members, pad_token_id=0).train
            self._algorithm(cfg).compute_advantages(train)
        except (TrinityError, RuntimeError, ValueError, TypeError) as exc:
            return None, f"{cfg.algorithm.advantage_fn} over the group failed: {exc}"
        assert train.advantages is not None
        out: list[float | None] = []
        for row in range(len(members)):
            mask = train.action_mask[row] > 0
            out.append(float(train.advantages[row][mask].mean()) if bool(mask.any()) else None)
        dropped = sum(v is None for v in out)
        note = f"{cfg.algorithm.advantage_fn} over the group's {len(members)} rows"
        if dropped:
            note += f"; {dropped} dropped by the advantage fn (e.g. a flat group)"
        return out, note
