"""An in-memory leasing buffer and a small SFT config for the trainer loop's unit tests."""

from __future__ import annotations

import asyncio
import pathlib
from dataclasses import dataclass, field

from services.common.config.schema import TrinityConfig
from services.common.experience import Experience
from services.trainer.build import build_engine
from services.trainer.service import TrainerLoop
from tests.fakes.trainer import experience


@dataclass
class FakeRead:
    lease_id: str
    experiences: list[Experience]
    end_of_data: bool = False


@dataclass
class FakeBuffer:
    """FIFO with leases: read moves rows to a lease, ack forgets them, nack puts them back in front."""

    rows: list[Experience] = field(default_factory=list)
    leased: dict[str, list[Experience]] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    closed: bool = False
    reader_of: dict[str, str] = field(default_factory=dict)  # lease -> reader_id
    reader_nacks: list[tuple[str, str]] = field(default_factory=list)  # (buffer, reader_id) asked

    async def read(self, buffer, batch_size, *, max_wait, lease_s, reader_id="", min_model_version=0):
        for _ in range(20):
            if self.rows or self.closed:
                break
            await asyncio.sleep(0.01)
        take, self.rows = self.rows[:batch_size], self.rows[batch_size:]
        lease = f"L{len(self.events)}"
        if take:
            self.leased[lease] = take
            self.reader_of[lease] = reader_id
        self.events.append(f"read {lease} {len(take)}")
        return FakeRead(lease if take else "", take, end_of_data=self.closed and not self.rows and not take)

    async def ack(self, lease_id):
        self.events.append(f"ack {lease_id}")
        self.leased.pop(lease_id)

    async def nack(self, lease_id):
        self.events.append(f"nack {lease_id}")
        self.rows = self.leased.pop(lease_id) + self.rows

    async def nack_reader(self, buffer, reader_id):
        self.reader_nacks.append((buffer, reader_id))
        mine = [lease for lease in self.leased if self.reader_of[lease] == reader_id]
        back = [row for lease in mine for row in self.leased.pop(lease)]
        self.rows = back + self.rows
        return len(back)


def small_cfg(tmp_path: pathlib.Path, **trainer) -> TrinityConfig:
    return TrinityConfig.model_validate(
        {
            "checkpoint_root_dir": str(tmp_path),
            "mode": "train",
            "algorithm": {"algorithm_type": "sft", "optimizer": {"lr": 3e-3}},
            "buffer": {"batch_size": 4},
            "trainer": {"micro_batch_size": 2, "save_interval": 2, **trainer},
            "monitor": {"monitor_type": "none"},
        }
    )


def fixed_rows(n_batches: int, start: int = 0) -> list[Experience]:
    """The same 4 (prompt, response) pairs in every batch, with distinct task ids."""
    pairs = [("1+2=", "3"), ("2+2=", "4"), ("3+4=", "7"), ("9+9=", "18")]
    return [
        experience(p, r, task_id=f"t{start + b}-{i}")
        for b in range(start, start + n_batches)
        for i, (p, r) in enumerate(pairs)
    ]


async def run_loop(cfg: TrinityConfig, buffer: FakeBuffer) -> TrainerLoop:
    built = build_engine(cfg, device="cpu")
    loop = TrainerLoop(cfg, built.engine, built.tokenizer, buffer, state=built.state)
    await loop.run()
    return loop
