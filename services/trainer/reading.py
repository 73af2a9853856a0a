"""The trainer loop's side of the buffer: read a step's rows under leases, ack them once trained.

Every lease is journaled (leases.py) from the moment a Read returns it until it is acked or given
back, so a trainer that dies in between lets its successor settle it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from services.common import errors
from services.common.config.schema import TrinityConfig
from services.common.logging import get_logger
from services.trainer.algorithms.api import ReadRequest
from services.trainer.leases import LeaseJournal
from services.trainer.ports import Collected, ExperienceSource, Status

log = get_logger("trainer")
RETRY_DELAY_S = 1.0


class LeasedReader:
    def __init__(
        self,
        cfg: TrinityConfig,
        source: ExperienceSource,
        leases: LeaseJournal,
        stop: asyncio.Event,
        status: Status,
    ) -> None:
        self.cfg = cfg
        self.source = source
        self.leases = leases
        self._stop = stop
        self.status = status

    async def collect(self, plan: Sequence[ReadRequest], step: int) -> Collected | None:
        """Read every request of a step's plan; None (leases given back) when asked to stop meanwhile."""
        got = Collected()
        for request in plan:
            if not await self.read_request(request, got, step):
                for lease in got.leases:
                    await self.source.nack(lease)
                    self.leases.release(lease)
                return None
        return got

    def input_buffers(self) -> list[str]:
        """Every buffer a step may read: the experience buffer and the auxiliary buffers."""
        trainer_input = self.cfg.buffer.trainer_input
        names = [trainer_input.experience_buffer.name]
        names += [aux.name or key for key, aux in trainer_input.auxiliary_buffers.items()]
        return list(dict.fromkeys(names))

    def buffer_name(self, request: ReadRequest) -> str:
        trainer_input = self.cfg.buffer.trainer_input
        if request.source == "experience":
            return trainer_input.experience_buffer.name
        aux = trainer_input.auxiliary_buffers.get(request.buffer_name)
        return (aux.name or request.buffer_name) if aux else request.buffer_name

    async def read_request(self, request: ReadRequest, got: Collected, step: int) -> bool:
        """Read until `request.batch_size` rows are held or the buffer ends; False if stopped."""
        buffer = self.buffer_name(request)
        wanted = request.batch_size
        have = 0
        while have < wanted:
            read = asyncio.ensure_future(
                self.source.read(
                    buffer,
                    wanted - have,
                    max_wait=self.cfg.trainer.read_timeout_s,
                    lease_s=self.cfg.buffer.lease_s,
                    min_model_version=request.min_model_version,
                    reader_id=self.cfg.trainer.name,
                )
            )
            stop = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not read.done():
                read.cancel()
                return False
            try:
                result = read.result()
            except (errors.Unavailable, errors.DeadlineExceeded) as exc:
                # The buffer restarts or is overloaded: rows we hold stay leased; try again shortly.
                log.warning("buffer_read_failed", buffer=buffer, error=str(exc))
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            if result.lease_id and result.experiences:
                got.leases.append(result.lease_id)
                self.leases.hold(result.lease_id)
            got.experiences.extend(result.experiences)
            got.is_expert.extend([request.is_expert] * len(result.experiences))
            have += len(result.experiences)
            got.per_buffer[buffer] = got.per_buffer.get(buffer, 0) + len(result.experiences)
            if result.end_of_data:
                got.end_of_data = True
                return True
            if have < wanted:
                self.status.state = "waiting_for_data"
                log.info("waiting_for_data", buffer=buffer, have=have, wanted=wanted, step=step)
        return True

    async def ack(self, lease: str) -> None:
        """Ack, retrying while the buffer is unreachable (within the lease); an unknown lease is logged.

        A lease the buffer no longer knows expired before the step finished (lease_s shorter than
        a step): its rows were handed out again and may be trained twice — raise buffer.lease_s.
        """
        deadline = time.monotonic() + self.cfg.buffer.lease_s
        stopping_deadline: float | None = None
        while True:
            try:
                await self.source.ack(lease)
                self.leases.release(lease)
                return
            except (errors.NotFound, errors.FailedPrecondition) as exc:
                log.warning("lease_lost_before_ack", lease=lease, error=str(exc), hint="raise buffer.lease_s")
                self.leases.release(lease)
                return
            except (errors.Unavailable, errors.DeadlineExceeded) as exc:
                if time.monotonic() > deadline:
                    raise
                if self._stop.is_set():
                    # Stopping (most often because the whole run is going down, the buffer with it):
                    # a short wait, not lease_s; the journal keeps the lease with its trained step,
                    # and the next trainer acks it once it resumed from a checkpoint that has it.
                    stopping_deadline = (
                        stopping_deadline or time.monotonic() + self.cfg.services.shutdown_grace_s
                    )
                    if time.monotonic() > stopping_deadline:
                        log.warning("ack_deferred_to_restart", lease=lease, error=str(exc))
                        return
                log.warning("ack_retry", lease=lease, error=str(exc))
                await asyncio.sleep(RETRY_DELAY_S)

    async def give_back(self, lease: str) -> None:
        """Return a lease's rows to the buffer untrained (an abandoned step); a lease the buffer no
        longer has, or a buffer that is gone, is left to the next trainer (the journal keeps it)."""
        try:
            await self.source.nack(lease)
            self.leases.release(lease)
        except errors.TrinityError as exc:
            log.warning("lease_return_deferred_to_restart", lease=lease, error=str(exc))
