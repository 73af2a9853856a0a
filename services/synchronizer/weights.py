"""The weight-transfer helpers trainer and explorer use, on top of SynchronizerClient.

Trainer (one process, rank 0 of a multi-GPU trainer):

    publisher = WeightPublisher(sync, cfg)                     # member_id = sync.member_id
    for step in ...:
        await sync.begin_trainer_step(step)                    # -> bool: publish predicted after this step
        ... train ...
        if await sync.end_trainer_step(step):                  # -> bool: publish now (version = step)
            await publisher.publish(model.state_dict(), step)  # checkpoint files or a broadcast, per config
    # publish(state_dict, step, *, config=None) -> Version (checkpoint: a sync-only dir, pruned later).

Explorer:

    receiver = WeightReceiver(sync, cfg)
    for step in range(reg.last_step + 1, ...):
        version = await receiver.before_step(step, into=model_state)   # held or released by the plan;
        ... explore with weights of `version` ...                      # loads in place when a sync is due
    # receive(version: Version, into=None) -> dict[str, Tensor]: load one announced version.

Both helpers run torch work in a thread (the heartbeat keeps beating), report every transfer to
the synchronizer, and raise WeightSyncError / DeadlineExceeded / FailedPrecondition on failure
after reporting it; the group is then gone and the next sync builds a new one. torch is imported
only when a helper moves weights, so a client that only coordinates stays light.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from services.common import errors
from services.common.logging import get_logger
from services.synchronizer.client import SynchronizerClient
from services.synchronizer.ledger import FileEntry, Version
from trinity_grpc.synchronizer.v1 import synchronizer_pb2 as pb

if TYPE_CHECKING:
    import torch

    from services.common.config import TrinityConfig

log = get_logger("synchronizer.weights")


class WeightPublisher:
    """Trainer side: publish(state_dict, step) by the configured sync_method (see module docstring)."""

    def __init__(
        self, client: SynchronizerClient, cfg: TrinityConfig, *, master_address: str | None = None
    ) -> None:
        self.client = client
        self.cfg = cfg.synchronizer
        self.run_dir = cfg.run_dir
        self.master_address = master_address or self.cfg.master_address or cfg.services.trainer.host
        self.colocated = self.cfg.in_place
        """mode colocate: the explorer maps the trainer's parameters (transfer/shared.py); a publish
        only names the shared directory, nothing is written or sent."""

    async def publish(
        self,
        state_dict: Mapping[str, torch.Tensor],
        step: int,
        *,
        config: Mapping[str, object] | None = None,
    ) -> Version:
        if self.cfg.method == "checkpoint":
            return await self._publish_checkpoint(state_dict, step, config)
        return await self._publish_broadcast(state_dict, step)

    async def publish_in_place(self, step: int, directory: str) -> Version:
        """mode colocate: version `step` is the weights in the shared `directory` (transfer/shared.py);
        the explorer learns the directory from the version, as it would a checkpoint's."""
        from services.synchronizer.transfer import shared

        manifest = os.path.join(directory, shared.MANIFEST)
        files = (FileEntry(shared.MANIFEST, await asyncio.to_thread(os.path.getsize, manifest)),)
        version, _ = await self.client.publish_version(step, directory, files)
        return version

    async def _publish_checkpoint(
        self, state_dict: Mapping[str, torch.Tensor], step: int, config: Mapping[str, object] | None
    ) -> Version:
        from services.synchronizer.transfer import checkpoint as ckpt

        path, files = await asyncio.to_thread(
            ckpt.write_checkpoint, state_dict, self.run_dir, step, config=config
        )
        version, _ = await self.client.publish_version(step, str(path), files)
        status = await self.client.get_status()
        held = [m.model_version for m in status.members if m.role == pb.ROLE_EXPLORER and m.alive]
        await asyncio.to_thread(
            ckpt.prune_sync_checkpoints,
            self.run_dir,
            keep_newest=self.cfg.keep_sync_checkpoints,
            keep_at_least=min(held, default=step),
        )
        return version

    async def _publish_broadcast(self, state_dict: Mapping[str, torch.Tensor], step: int) -> Version:
        import torch

        from services.synchronizer.transfer import broadcast as bc

        tensors = bc.manifest_of(state_dict)
        version, receivers = await self.client.publish_version(step, tensors=tensors)
        if not receivers:
            return version
        backend = (
            "nccl" if any(t.is_cuda for t in state_dict.values()) and torch.cuda.is_available() else "gloo"
        )
        timeout = self.cfg.sync_timeout
        store = await asyncio.to_thread(
            bc.start_store, "0.0.0.0", self.cfg.master_port, len(receivers) + 1, timeout
        )
        try:
            got = await self.client.join_weight_group(step, self.master_address, store.port, backend)
            spec = bc.GroupSpec(
                got.master_address, got.master_port, got.world_size, 0, got.group_name, backend, timeout
            )

            def send(
                store: torch.distributed.TCPStore,
            ) -> None:  # an argument, so `del store` drops the last reference
                with bc.WeightGroup(spec, store) as group:
                    group.send(state_dict, tensors, got.bucket_bytes)

            await asyncio.to_thread(send, store)
        except errors.TrinityError as exc:
            await _report_failure(self.client, step, exc)
            raise
        finally:
            del store
        await self.client.report_sync(step, True)
        return version


class WeightReceiver:
    """Explorer side: before_step(step, into) follows the plan; receive(version, into) loads one version."""

    def __init__(
        self,
        client: SynchronizerClient,
        cfg: TrinityConfig,
        *,
        progress: Callable[[int, int], None] | None = None,
        in_place: bool = False,
    ) -> None:
        self.client = client
        self.cfg = cfg.synchronizer
        self.progress = progress  # progress(done, total) per broadcast bucket (nccl), from a thread
        # nccl: False stages the broadcast in fresh tensors and copies into `into` only after it all
        # arrived, so a failed sync leaves the model at the version it held (costs one copy of the
        # weights in memory); True receives straight into `into` and, on failure, marks the held
        # version -1 (weights partly overwritten) so the plan makes the explorer load a full version.
        self.in_place = in_place

    async def before_step(self, step: int, into: Mapping[str, torch.Tensor] | None = None) -> int:
        """Ask the plan before `step`; load the version it names (in place into `into`). Returns
        the version the explorer holds for this step."""
        decision = await self.client.begin_explorer_step(step)
        if decision.load is not None:
            log.info(
                "sync",
                member=self.client.member_id,
                step=step,
                version=decision.load.version,
                reason=decision.reason,
            )
            await self.receive(decision.load, into=into)
        return self.client.held

    async def receive(
        self, version: Version, into: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        try:
            if self.cfg.method == "checkpoint":
                from services.synchronizer.transfer import checkpoint as ckpt

                out = await asyncio.to_thread(
                    ckpt.load_checkpoint, version.checkpoint_path, version.files or None, into=into
                )
            else:
                out = await self._receive_broadcast(version, into)
        except errors.TrinityError as exc:
            await _report_failure(self.client, version.version, exc)
            raise
        await self.client.report_sync(version.version, True)
        return out

    async def _receive_broadcast(
        self, version: Version, into: Mapping[str, torch.Tensor] | None
    ) -> dict[str, torch.Tensor]:
        from services.synchronizer.transfer import broadcast as bc

        got = await self.client.join_weight_group(version.version)
        spec = bc.GroupSpec(
            got.master_address,
            got.master_port,
            got.world_size,
            got.rank,
            got.group_name,
            got.backend,
            self.cfg.sync_timeout,
        )

        def receive() -> dict[str, torch.Tensor]:
            with bc.WeightGroup(spec) as group:
                staged = group.receive(
                    got.tensors, got.bucket_bytes, into if self.in_place else None, self.progress
                )
            if into is None or self.in_place:
                return staged
            with torch.no_grad():
                for name, tensor in staged.items():
                    into[name].copy_(tensor)
            return dict(into)

        import torch

        try:
            return await asyncio.to_thread(receive)
        except errors.TrinityError:
            if self.in_place and into is not None:
                self.client.held = -1
            raise


async def _report_failure(client: SynchronizerClient, version: int, exc: BaseException) -> None:
    log.error("weight_sync_failed", member=client.member_id, version=version, error=str(exc))
    with contextlib.suppress(errors.TrinityError):
        await client.report_sync(version, False, str(exc))
