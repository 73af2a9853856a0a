"""`synchronizer:` — the sync plan and weight transfer (Trinity-RFT's keys plus liveness)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from services.common.config.base import Section


class SynchronizerConfig(Section):
    sync_method: Literal["nccl", "checkpoint", "memory", "online", "offline"] = "nccl"
    """nccl: torch.distributed group (nccl on GPU, gloo on CPU); checkpoint: files on shared storage.
    Trinity's other names: memory and online are nccl here (weights go memory to memory, no files),
    offline is checkpoint."""
    sync_interval: int = Field(1, ge=1)
    """Steps between weight syncs."""
    sync_offset: int = Field(0, ge=0)
    """Explorer head start in steps."""
    sync_timeout: float = Field(3600.0, gt=0)
    """Seconds any single wait of a sync may take before it fails loudly."""
    sync_style: Literal[
        "fixed",
        "dynamic_by_trainer",
        "trainer_driven",
        "dynamic_by_explorer",
        "explorer_driven",
        "fully_async",
    ] = "fixed"
    """When syncs happen (trainer_driven / explorer_driven are Trinity's aliases). fully_async
    (Trinity v0.6): the trainer publishes every trainer_sync_interval steps and trains on; each
    explorer loads the newest version every explorer_sync_interval steps; nobody is held for a sync,
    only by max_staleness."""
    explorer_sync_interval: int | None = Field(None, ge=1)
    """sync_style fully_async: explorer steps between its checks for a newer version (None:
    sync_interval). Other styles accept only None or sync_interval."""
    trainer_sync_interval: int | None = Field(None, ge=1)
    """sync_style fully_async: trainer steps between publishes (None: sync_interval). Other styles
    accept only None or sync_interval."""
    max_staleness: int | None = Field(None, ge=1)
    """Admission bound, in trainer steps: no explorer step s starts unless the version it holds is
    >= (step that will train it) - max_staleness; otherwise it waits for (or asks for) a newer
    version. 1 is strictly on-policy; None is unbounded."""
    heartbeat_interval_s: float = Field(2.0, gt=0)
    """Seconds between member heartbeats."""
    member_timeout_s: float = Field(10.0, gt=0)
    """A member that misses heartbeats this long is reported dead."""
    bucket_mb: int = Field(256, ge=1)
    """Bucket size of the weight broadcast, in MiB."""
    master_port: int = Field(0, ge=0, le=65535)
    """Port of the weight group's store on the trainer; 0 picks a free one per sync."""
    master_address: str | None = None
    """Address explorers use to reach the trainer's weight-group store; None: services.trainer.host."""
    keep_sync_checkpoints: int = Field(2, ge=1)
    """sync_method checkpoint: newest sync-only checkpoints kept; older ones that no live
    explorer still holds are deleted (the trainer's full checkpoints, under checkpoints/full/,
    are not touched: see trainer.max_checkpoints_to_keep)."""

    @model_validator(mode="after")
    def _split_intervals_only_fully_async(self) -> SynchronizerConfig:
        if self.normalized_style == "fully_async":
            return self
        for key in ("explorer_sync_interval", "trainer_sync_interval"):
            value = getattr(self, key)
            if value is not None and value != self.sync_interval:
                raise ValueError(
                    f"synchronizer.{key} ({value}) differs from sync_interval ({self.sync_interval}): "
                    f"only sync_style fully_async syncs trainer and explorer on separate intervals "
                    f"(sync_style is {self.sync_style!r}); set sync_style: fully_async or drop {key}"
                )
        return self

    @model_validator(mode="after")
    def _staleness_reachable(self) -> SynchronizerConfig:
        # With a schedule fixed by the trainer, versions appear only every sync_interval steps, so a
        # tighter bound would hold an explorer for a version that is never published.
        if (
            self.max_staleness is not None
            and self.normalized_style != "dynamic_by_explorer"
            and self.max_staleness < self.publish_interval
        ):
            key = "trainer_sync_interval" if self.normalized_style == "fully_async" else "sync_interval"
            raise ValueError(
                f"synchronizer.max_staleness ({self.max_staleness}) must be >= {key} "
                f"({self.publish_interval}) with sync_style {self.sync_style!r}: versions are published only "
                f"every {key} steps; raise max_staleness or use sync_style dynamic_by_explorer"
            )
        return self

    @property
    def publish_interval(self) -> int:
        """Trainer steps between publishes (trainer_sync_interval under fully_async)."""
        if self.normalized_style == "fully_async":
            return self.trainer_sync_interval or self.sync_interval
        return self.sync_interval

    @property
    def check_interval(self) -> int:
        """Explorer steps between syncs (explorer_sync_interval under fully_async)."""
        if self.normalized_style == "fully_async":
            return self.explorer_sync_interval or self.sync_interval
        return self.sync_interval

    _in_place: bool = PrivateAttr(default=False)  # set by TrinityConfig for mode colocate

    @property
    def method(self) -> Literal["nccl", "checkpoint"]:
        """sync_method with Trinity's other names resolved: nccl or checkpoint. In mode colocate
        checkpoint, whatever was given: versions name a directory (the shared weights') and the
        synchronizer hands out the latest, as it does checkpoints; no tensor travels (in_place)."""
        if self._in_place:
            return "checkpoint"
        return "checkpoint" if self.sync_method in ("checkpoint", "offline") else "nccl"

    @property
    def in_place(self) -> bool:
        """mode colocate: trainer and explorer map one copy of the weights (transfer/shared.py)."""
        return self._in_place

    @property
    def normalized_style(self) -> str:
        return {"trainer_driven": "dynamic_by_trainer", "explorer_driven": "dynamic_by_explorer"}.get(
            self.sync_style, self.sync_style
        )
