"""`synchronizer:` — the sync plan and weight transfer (Trinity-RFT's keys plus liveness)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.common.config.base import Section


class SynchronizerConfig(Section):
    sync_method: Literal["nccl", "checkpoint"] = "nccl"
    """nccl: torch.distributed group (nccl on GPU, gloo on CPU); checkpoint: files on shared storage."""
    sync_interval: int = Field(1, ge=1)
    """Steps between weight syncs."""
    sync_offset: int = Field(0, ge=0)
    """Explorer head start in steps."""
    sync_timeout: float = Field(3600.0, gt=0)
    """Seconds any single wait of a sync may take before it fails loudly."""
    sync_style: Literal[
        "fixed", "dynamic_by_trainer", "trainer_driven", "dynamic_by_explorer", "explorer_driven"
    ] = "fixed"
    """When syncs happen (trainer_driven / explorer_driven are Trinity's aliases)."""
    max_staleness: int | None = Field(None, ge=0)
    """Admission bound: no explorer step starts whose data would be older than this when trained."""
    heartbeat_interval_s: float = Field(2.0, gt=0)
    """Seconds between member heartbeats."""
    member_timeout_s: float = Field(10.0, gt=0)
    """A member that misses heartbeats this long is reported dead."""
    bucket_mb: int = Field(256, ge=1)
    """Bucket size of the weight broadcast, in MiB."""
    master_port: int = Field(0, ge=0, le=65535)
    """Port of the weight group's store; 0 picks a free one."""

    @property
    def normalized_style(self) -> str:
        return {"trainer_driven": "dynamic_by_trainer", "explorer_driven": "dynamic_by_explorer"}.get(
            self.sync_style, self.sync_style
        )
