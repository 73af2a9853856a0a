"""`monitor:`, `log:`, `cluster:`, `data_processor:` — smaller Trinity sections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from services.common.config.base import Section


class MonitorConfig(Section):
    monitor_type: Literal["tensorboard", "none"] = "tensorboard"
    """Metrics sink; TensorBoard files go under <run dir>/monitor/tensorboard/<service>."""
    monitor_args: dict[str, Any] = Field(default_factory=dict)
    """Extra arguments of the sink."""
    enable_ray_timeline: bool = False
    """Accepted for Trinity compatibility; no effect."""
    interval_s: float = Field(10.0, gt=0)
    """Seconds between samples of the buffer's and the synchronizer's counters (their TensorBoard scalars)."""


class LogConfig(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level of every service."""
    group_by_node: bool = False
    """Accepted for Trinity compatibility; no effect."""


class ClusterConfig(Section):
    node_num: int = Field(1, ge=1)
    """Nodes."""
    gpu_per_node: int = Field(0, ge=0)
    """GPUs per node (0: CPU only)."""


class OperatorConfig(Section):
    name: str
    """Registered operator name or dotted path."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Operator arguments."""


class PipelineConfig(Section):
    operators: list[OperatorConfig] = Field(default_factory=list)
    """Operators, applied in order."""
    num_process: int | None = None
    """Accepted for Trinity compatibility."""
    inputs: list[str] = Field(default_factory=list)
    """Task pipeline inputs (Trinity)."""
    target_fields: list[str] = Field(default_factory=list)
    """Task pipeline fields (Trinity)."""


class DataProcessorConfig(Section):
    task_pipeline: PipelineConfig | None = None
    """Operators applied to tasks (not implemented: rejected when operators are given)."""
    experience_pipeline: PipelineConfig | None = None
    """Operators applied to each explorer step's experiences before they are written."""
