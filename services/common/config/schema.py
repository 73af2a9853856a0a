"""The root of the YAML: Trinity-RFT's top-level keys plus `services:`."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from services.common.config.algorithm import AlgorithmConfig
from services.common.config.base import Section
from services.common.config.buffer import BufferConfig
from services.common.config.cod import CodConfig
from services.common.config.colocate import colocate_problem
from services.common.config.cpt import cpt_problems
from services.common.config.explorer import ExplorerConfig
from services.common.config.model import ModelConfig
from services.common.config.monitor import (
    ClusterConfig,
    DataProcessorConfig,
    LogConfig,
    MonitorConfig,
    ServiceConfig,
)
from services.common.config.services import ServicesConfig
from services.common.config.synchronizer import SynchronizerConfig
from services.common.config.trainer import TrainerConfig
from services.common.config.verl import mapped_settings

Mode = Literal["both", "train", "explore", "bench", "serve", "colocate"]


class StageConfig(Section):
    """One entry of `stages:`; sections given here are merged over the global ones."""

    stage_name: str
    """Unique name; the stage runs as experiment `<name>/<stage_name>`."""
    mode: Mode | None = None
    """Mode of this stage (inherits the global mode)."""
    algorithm: dict[str, Any] | None = None
    """Overrides of `algorithm:`."""
    buffer: dict[str, Any] | None = None
    """Overrides of `buffer:`."""
    explorer: dict[str, Any] | None = None
    """Overrides of `explorer:`."""
    trainer: dict[str, Any] | None = None
    """Overrides of `trainer:`."""
    data_processor: dict[str, Any] | None = None
    """Trinity's per-stage pipelines: refused when given (set data_processor at the top level)."""

    @model_validator(mode="after")
    def _no_stage_pipelines(self) -> StageConfig:
        if self.data_processor is not None:
            raise ValueError(
                f"stages[{self.stage_name}].data_processor: a per-stage data_processor is not supported; "
                "set data_processor at the top level (it applies to every stage)"
            )
        return self

    synchronizer: dict[str, Any] | None = None
    """Overrides of `synchronizer:`."""
    model: dict[str, Any] | None = None
    """Overrides of `model:` (the model path is normally the previous stage's weights)."""


class TrinityConfig(Section):
    project: str = "trinity-grpc"
    """Project name; runs live under <checkpoint_root_dir>/<project>/<name>/."""
    group: str = ""
    """Trinity's run group: when set, runs live under <checkpoint_root_dir>/<project>/<group>/<name>/
    and wandb / mlflow / swanlab run names start with `<group>/` (default: none)."""
    name: str = "default"
    """Experiment name."""
    mode: Mode = "both"
    """both: train and explore; train; explore; bench: evaluate checkpoints; serve: the explorer is an
    OpenAI-compatible proxy whose traffic, with the agents' rewards, fills the experience buffer for a
    `train` run (docs/serve.md); colocate: train and explore as in both, holding one copy of the
    weights between them (docs/colocate.md)."""
    checkpoint_root_dir: str = "./runs"
    """Root of checkpoints, buffers, logs and TensorBoard files."""
    continue_from_checkpoint: bool = True
    """Resume the run in <run dir> if there is one (a finished stage is skipped unless total_steps
    was raised, then it trains on to the new total); false starts <name>_<timestamp>."""
    ray_namespace: str | None = None
    """Accepted for Trinity compatibility; no effect."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    """Algorithm and its parts."""
    model: ModelConfig = ModelConfig()
    """Model and token limits."""
    cluster: ClusterConfig = ClusterConfig()
    """Nodes and GPUs."""
    buffer: BufferConfig = BufferConfig()
    """Tasksets and experience buffers."""
    explorer: ExplorerConfig = ExplorerConfig()
    """Rollout engines and workflows."""
    trainer: TrainerConfig = TrainerConfig()
    """Training loop."""
    synchronizer: SynchronizerConfig = SynchronizerConfig()
    """Sync plan and weight transfer."""
    monitor: MonitorConfig = MonitorConfig()
    """Metrics."""
    log: LogConfig = LogConfig()
    """Logging."""
    data_processor: DataProcessorConfig = DataProcessorConfig()
    """Task and experience pipelines."""
    service: ServiceConfig = ServiceConfig()
    """Trinity's helper services (service.data_juicer is refused: not integrated here)."""
    stages: list[StageConfig] = Field(default_factory=list)
    """Stages run in order, each from the previous stage's final weights."""
    services: ServicesConfig = ServicesConfig()
    """Addresses, security and timeouts of the four services."""
    cod: CodConfig | None = None
    """Trinity v0.6's research Connect-the-Dots section: given, the explorer packs tasks for the cod_*
    workflows (docs/workflows.md); unset: no packing."""

    _stage_configs: list[TrinityConfig] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _one_grad_clip(self) -> TrinityConfig:
        optimizer, trainer = self.algorithm.optimizer, self.trainer
        if (
            trainer.grad_clip is not None
            and "grad_clip" in optimizer.model_fields_set
            and trainer.grad_clip != optimizer.grad_clip
        ):
            raise ValueError(
                f"trainer.grad_clip ({trainer.grad_clip}) and algorithm.optimizer.grad_clip "
                f"({optimizer.grad_clip}) are the same setting with different values; give one of them"
            )
        return self

    @model_validator(mode="after")
    def _lora_on_one_process(self) -> TrinityConfig:
        if self.model.lora is not None and self.trainer.strategy == "fsdp2":
            raise ValueError(
                "trainer.strategy fsdp2 with model.lora_configs is not supported yet: use strategy single "
                "(LoRA's frozen base and small optimizer state often fit one GPU), or remove model.lora_configs"
            )
        return self

    @model_validator(mode="after")
    def _one_weight_bucket(self) -> TrinityConfig:
        given = self.explorer.rollout_model.weight_sync_buffer_size
        if (
            given is not None
            and "bucket_mb" in self.synchronizer.model_fields_set
            and given != self.synchronizer.bucket_mb
        ):
            raise ValueError(
                f"explorer.rollout_model.weight_sync_buffer_size ({given}) and synchronizer.bucket_mb "
                f"({self.synchronizer.bucket_mb}) are one setting (MiB per bucket of the weight broadcast); "
                "give one of them"
            )
        return self

    @model_validator(mode="after")
    def _serve_sync_plan(self) -> TrinityConfig:
        if self.mode != "serve":
            return self
        sync = self.synchronizer
        if sync.method != "checkpoint":
            raise ValueError(
                f"mode serve with synchronizer.sync_method {sync.sync_method!r}: the proxy loads new weights "
                "from checkpoint files between requests; set synchronizer.sync_method: checkpoint"
            )
        if sync.normalized_style not in ("dynamic_by_trainer", "fully_async"):
            raise ValueError(
                f"mode serve with synchronizer.sync_style {sync.sync_style!r}: the proxy has no steps of its own "
                "to hold; set sync_style dynamic_by_trainer (load each version the trainer publishes) or "
                "fully_async (check every explorer_sync_interval x explorer.service_status_check_interval s)"
            )
        if sync.max_staleness is not None:
            raise ValueError(
                "mode serve with synchronizer.max_staleness: the proxy never holds an agent's request for "
                "weights; remove max_staleness (the trainer reads what the agents committed)"
            )
        return self

    @model_validator(mode="after")
    def _colocate_fits(self) -> TrinityConfig:
        if self.mode != "colocate":
            return self
        problem = colocate_problem(self)
        if problem is not None:
            raise ValueError(problem)
        self.synchronizer._in_place = True
        return self

    @model_validator(mode="after")
    def _external_model_only_in_bench(self) -> TrinityConfig:
        if self.model.external_model.enable and self.mode != "bench":
            raise ValueError(
                f"model.external_model.enable: true works in mode bench only, not mode {self.mode}: a remote "
                "chat API returns text without token ids or logprobs, so it can be scored but not trained on "
                "or served; set mode: bench, or remove model.external_model"
            )
        return self

    @model_validator(mode="after")
    def _critic_warmup_needs_a_critic(self) -> TrinityConfig:
        if self.trainer.critic_warmup and not self.algorithm.use_critic:
            raise ValueError(
                f"trainer.critic_warmup {self.trainer.critic_warmup}: algorithm_type "
                f"{self.algorithm.algorithm_type!r} has no critic, so its first {self.trainer.critic_warmup} "
                "steps would train nothing; remove the key (or use an algorithm with a critic, e.g. ppo)"
            )
        return self

    @model_validator(mode="after")
    def _cpt_trains_on_a_text_file(self) -> TrinityConfig:
        problems = cpt_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @model_validator(mode="before")
    @classmethod
    def _bypass_from_verl(cls, data: Any) -> Any:
        """trainer.trainer_config's algorithm.rollout_correction.bypass_mode (where Trinity v0.5.2's veRL
        read it) fills algorithm.bypass_old_logprobs when the algorithm section gives no bypass."""
        if not isinstance(data, dict) or not isinstance(data.get("trainer"), dict):
            return data
        tree: Any = data["trainer"].get("trainer_config")
        for key in ("algorithm", "rollout_correction", "bypass_mode"):
            tree = tree.get(key) if isinstance(tree, dict) else None
        algorithm = data.get("algorithm") or {}
        if tree is None or not isinstance(algorithm, dict):
            return data
        correction = algorithm.get("rollout_correction")
        own = isinstance(correction, dict) and correction.get("bypass_mode") is not None
        if algorithm.get("bypass_old_logprobs") is None and not own:
            return {**data, "algorithm": {**algorithm, "bypass_old_logprobs": tree}}
        return data

    @model_validator(mode="after")
    def _verl_bypass_agrees(self) -> TrinityConfig:
        verl = mapped_settings(self.trainer.trainer_config).get("algorithm.bypass_old_logprobs")
        if verl is not None and verl != self.algorithm.bypass_old_logprobs:
            raise ValueError(
                f"trainer.trainer_config.algorithm.rollout_correction.bypass_mode ({verl}) and "
                f"algorithm.bypass_old_logprobs ({self.algorithm.bypass_old_logprobs}) are one setting; "
                "give one (algorithm.bypass_old_logprobs is Trinity v0.6's key)"
            )
        return self

    @model_validator(mode="after")
    def _verl_cliprange_agrees(self) -> TrinityConfig:
        verl = mapped_settings(self.trainer.trainer_config).get(
            "algorithm.value_loss_fn_args.cliprange_value"
        )
        ours = (self.algorithm.value_loss_fn_args or {}).get("cliprange_value", 0.5)
        if verl is not None and verl != ours:
            raise ValueError(
                f"trainer.trainer_config.critic.cliprange_value ({verl}) differs from the critic clip used here "
                f"({ours}); set algorithm.value_loss_fn_args.cliprange_value instead"
            )
        return self

    @property
    def grad_clip(self) -> float:
        """The gradient-norm clip: trainer.grad_clip (Trinity's key) or algorithm.optimizer.grad_clip."""
        return (
            self.trainer.grad_clip
            if self.trainer.grad_clip is not None
            else self.algorithm.optimizer.grad_clip
        )

    @property
    def run_dir(self) -> str:
        """<checkpoint_root_dir>/<project>[/<group>]/<name>: everything this run writes."""
        return os.path.join(self.checkpoint_root_dir, self.project, self.group, self.name)

    @property
    def train_batch_size(self) -> int:
        """Experiences per training step (buffer.train_batch_size or batch_size * repeat_times)."""
        return self.buffer.train_batch_size or self.buffer.batch_size * self.algorithm.repeat_times

    @property
    def stage_configs(self) -> list[TrinityConfig]:
        """The full config of each stage, in order ([self] when there are no stages)."""
        return self._stage_configs or [self]
