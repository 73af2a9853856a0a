"""`monitor:`, `log:`, `cluster:`, `data_processor:` — smaller Trinity sections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from services.common.config.base import Section


class MonitorConfig(Section):
    monitor_type: Literal["tensorboard", "none", "wandb", "mlflow", "swanlab"] = "tensorboard"
    """Metrics sink; TensorBoard files go under <run dir>/monitor/tensorboard/<service>; wandb, mlflow
    and swanlab need their package installed (services/common/monitor_extras.py)."""
    monitor_args: dict[str, Any] = Field(default_factory=dict)
    """wandb / mlflow / swanlab: keyword arguments of the package's run constructor (e.g. wandb
    `mode: offline`; mlflow `tracking_uri`); tensorboard and none take none (rejected)."""

    @model_validator(mode="after")
    def _no_ray_timeline(self) -> MonitorConfig:
        if self.enable_ray_timeline:
            raise ValueError(
                "monitor.enable_ray_timeline: there is no Ray here, so no Ray timeline; "
                "per-step timings are logged as the time/* metrics (set it to false or remove it)"
            )
        return self

    @model_validator(mode="after")
    def _args_have_a_reader(self) -> MonitorConfig:
        if self.monitor_args and self.monitor_type in ("tensorboard", "none"):
            raise ValueError(
                f"monitor.monitor_args: monitor_type {self.monitor_type} takes no arguments; "
                "they apply to wandb, mlflow and swanlab"
            )
        return self

    enable_ray_timeline: bool = False
    """Trinity's Ray timeline: false only (there is no Ray here; per-step timings are the time/* metrics)."""
    interval_s: float = Field(10.0, gt=0)
    """Seconds between samples of the buffer's and the synchronizer's counters (their TensorBoard scalars)."""


class LogConfig(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level of every service."""
    group_by_node: bool = False
    """Accepted for Trinity compatibility; no effect."""


class ClusterConfig(Section):
    node_num: int = Field(1, ge=1)
    """Nodes of the trainer (torchrun's nnodes, as the k8s trainer Job runs it); `trinity run` drives
    one machine and refuses more than 1 (several machines: start the services on each, docs/deploy.md)."""
    gpu_per_node: int = Field(0, ge=0)
    """GPUs the config expects; `trinity config check` warns when fewer are visible (run uses the
    GPUs it finds, CPU when none)."""


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
    save_input: bool = True
    """Experience pipeline: append each explore step's experiences as they were before the operators
    to input_save_path (JSON lines); only when there are operators (without them the buffer holds
    exactly the input)."""
    input_save_path: str | None = None
    """File of save_input, a .jsonl or .json path (default <run dir>/buffer/pipeline_input.jsonl)."""

    @model_validator(mode="after")
    def _json_lines_path(self) -> PipelineConfig:
        path = self.input_save_path
        if path is not None and not path.endswith((".jsonl", ".json")):
            raise ValueError(
                f"data_processor.experience_pipeline.input_save_path {path!r}: give a .jsonl or .json file "
                "(the input is saved as JSON lines; database URLs are not supported here)"
            )
        return self


class DataProcessorConfig(Section):
    task_pipeline: PipelineConfig | None = None
    """Operators applied to tasks: not implemented, so a pipeline with operators is rejected
    (prepare the task file beforehand, e.g. with Data-Juicer)."""
    experience_pipeline: PipelineConfig | None = None
    """Operators applied to each explorer step's experiences before they are written."""

    @model_validator(mode="after")
    def _no_task_operators(self) -> DataProcessorConfig:
        if self.task_pipeline is not None and self.task_pipeline.operators:
            raise ValueError(
                "data_processor.task_pipeline.operators: task operators are not implemented here; "
                "prepare the task file beforehand (e.g. with Data-Juicer) and remove task_pipeline"
            )
        return self


class ServiceConfig(Section):
    """Trinity's `service:` section: helper services Trinity starts beside a run."""

    data_juicer: dict[str, Any] | None = None
    """Trinity's Data-Juicer service (for data_juicer operators): refused when given, Data-Juicer is
    not integrated here (prepare data beforehand; experience operators run in the explorer)."""

    @model_validator(mode="after")
    def _no_data_juicer(self) -> ServiceConfig:
        if self.data_juicer is not None:
            raise ValueError(
                "service.data_juicer: the Data-Juicer service is not integrated in this project (no "
                "data_juicer operators); prepare tasks with Data-Juicer beforehand and remove service"
            )
        return self
