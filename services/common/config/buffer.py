"""`buffer:` — task sets and experience buffers (Trinity-RFT's keys)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from services.common.config.base import Section


class FormatConfig(Section):
    prompt_type: Literal["plaintext", "messages"] = "plaintext"
    """plaintext: the prompt is a string column; messages: a list of chat messages."""
    prompt_key: str = "prompt"
    """Column with the prompt (plaintext)."""
    response_key: str = "response"
    """Column with the reference answer / response."""
    system_prompt_key: str | None = None
    """Column with a per-row system prompt."""
    system_prompt: str | None = None
    """System prompt for every row (lower priority than system_prompt_key)."""
    messages_key: str = "messages"
    """Column with chat messages (prompt_type messages)."""
    tools_key: str = "tools"
    """Column with a row's tool definitions, passed to the chat template of the messages rows the
    trainer reads (SFT / DPO datasets)."""
    chosen_key: str = "chosen"
    """DPO: column with the chosen response (a string, or messages ending with the assistant's); a
    dataset row with both chosen_key and rejected_key is a preference pair."""
    rejected_key: str = "rejected"
    """DPO: column with the rejected response (as chosen_key)."""
    enable_concatenated_multi_turn: bool = False
    """SFT on messages rows: train on every assistant turn of the conversation (one sequence, the
    other turns masked out) instead of the last assistant turn only."""
    chat_template: str | None = None
    """Chat template of the messages rows the trainer reads (SFT / DPO datasets), overriding
    model.custom_chat_template (and the tokenizer's)."""
    enable_thinking: bool | None = None
    """The chat template's enable_thinking switch for the messages rows the trainer reads (SFT / DPO
    datasets); None: model.enable_thinking."""
    text_key: str = "text"
    """algorithm_type cpt: column with a row's plain text, one document trained on whole (no chat
    template, no prompt). Our key: the Trinity v0.6 schema we could read has no key for CPT rows."""
    reply_prefix: str | None = None
    """Text appended after the prompt (e.g. a plaintext model's answer cue)."""
    image_key: str | None = None
    """Column of images (Trinity's multi-modal rows): refused when set, the engines and trainer here
    are text-only."""
    video_key: str | None = None
    """Column of videos: refused when set, as image_key."""

    @model_validator(mode="after")
    def _text_only(self) -> FormatConfig:
        for key in ("image_key", "video_key"):
            if getattr(self, key) is not None:
                raise ValueError(
                    f"format.{key} {getattr(self, key)!r}: multi-modal rows are not supported here (the "
                    "engines, workflows and trainer take text only); use a text taskset and remove the key"
                )
        return self


class BotsConfig(Section):
    """Trinity's `data_selector.kwargs`: the BOTS estimator of difficulty_based with feature_keys
    (services/buffer/kinds/bots.py). Each task's pass rate is a Beta(alpha, beta) belief, updated
    from the explorer's pass rates and from an interpolation between the two feature columns."""

    m: int = Field(16, ge=1)
    """Rollouts a pass rate stands for: one report adds m pseudo-trials to a task's Beta counts."""
    lamb: float = Field(0.2, ge=0, le=1)
    """Forgetting lambda: each report keeps (1 - lamb) of every task's counts (and adds lamb)."""
    rho: float = Field(0.2, ge=0, le=1)
    """Weight of the interpolated pass rate against the observed one in an update."""
    adaptive_rho: bool = False
    """Halve rho whenever the interpolation misses the observed pass rates by 0.25 or more (mean)."""
    target_reward: float = Field(1.0, ge=0, le=1)
    """Prefer tasks whose estimated pass rate is near this (0.5: the tasks the model solves half the time)."""
    tau: float = Field(1.0, ge=0)
    """Sampling temperature over -|target_reward - pass rate|; 0 takes the batch_size best tasks."""
    do_sample: bool = False
    """Score a draw from each task's Beta belief (Thompson sampling) instead of its mean."""


class TaskSelectorConfig(Section):
    selector_type: Literal["sequential", "shuffle", "random", "difficulty_based", "offline_easy2hard"] = (
        "sequential"
    )
    """Order of tasks: file order, reshuffled per epoch, sampled with replacement, by pass rate, or
    offline_easy2hard (Trinity's: sorted once by the feature_keys columns, highest first — e.g. prior
    pass rates, easiest first — and read in that order every epoch)."""
    seed: int = 42
    """Seed of shuffle/random (shuffle reseeds with seed + epoch)."""
    target_pass_rate: float = Field(0.5, ge=0, le=1)
    """difficulty_based: prefer tasks whose pass rate is near this."""
    temperature: float = Field(1.0, gt=0)
    """difficulty_based: sharpness of the preference."""
    feature_keys: list[str] = Field(default_factory=list)
    """difficulty_based with BOTS (Trinity's estimator): two columns of per-task prior pass rates in
    [0, 1], from a weaker and a stronger reference model; empty: the pass-rate selector above.
    offline_easy2hard: the columns to sort by (compared in order, highest first)."""
    kwargs: BotsConfig = BotsConfig()
    """BOTS's arguments (with feature_keys; target_pass_rate and temperature do not apply then)."""

    @model_validator(mode="after")
    def _bots_settings(self) -> TaskSelectorConfig:
        if self.selector_type == "offline_easy2hard":
            if not self.feature_keys:
                raise ValueError(
                    "offline_easy2hard sorts the tasks by feature_keys (numeric columns, higher = easier, "
                    "e.g. prior pass rates); set feature_keys"
                )
            if self.kwargs != BotsConfig():
                raise ValueError(
                    "kwargs are BOTS's arguments (difficulty_based); offline_easy2hard takes none"
                )
            return self
        if not self.feature_keys:
            if self.kwargs != BotsConfig():  # defaults written out (a resolved config) are fine
                raise ValueError(
                    "kwargs are the arguments of BOTS's estimator, which needs feature_keys (two columns "
                    "of prior pass rates); set feature_keys or remove kwargs"
                )
            return self
        if self.selector_type != "difficulty_based":
            raise ValueError(
                f"feature_keys drive the difficulty_based selector, not {self.selector_type!r}; "
                "set selector_type: difficulty_based or remove feature_keys"
            )
        if len(set(self.feature_keys)) != 2 or len(self.feature_keys) != 2:
            raise ValueError(
                "feature_keys needs exactly 2 different columns (prior pass rates of a weaker and a "
                f"stronger reference model), got {self.feature_keys}"
            )
        defaults = TaskSelectorConfig.model_fields
        own = sorted(
            k for k in ("target_pass_rate", "temperature") if getattr(self, k) != defaults[k].default
        )
        if own:
            raise ValueError(
                f"{', '.join(own)} belong to the pass-rate selector without feature_keys; with "
                "feature_keys use kwargs.target_reward and kwargs.tau"
            )
        return self


PRIORITY_FN_NAMES = ("decay_limit_randomization", "linear_decay")
"""The buffer's built-in priority fns (services/buffer/kinds/priority.py's registry, Trinity's names)."""


def check_priority_fn(name: str) -> str:
    """A built-in priority fn's name or a dotted path (a path's import is `trinity config check`'s)."""
    if name not in PRIORITY_FN_NAMES and "." not in name:
        raise ValueError(
            f"unknown priority_fn {name!r}; use one of {', '.join(PRIORITY_FN_NAMES)} or a dotted path "
            "pkg.module.Class of your own"
        )
    return name


class ReplayBufferConfig(Section):
    """Trinity's `replay_buffer:` of a queue: the priority-queue keys of StorageConfig, grouped."""

    enable: bool = False
    """A priority queue instead of fifo (the same as use_priority_queue)."""
    priority_fn: str = "linear_decay"
    """linear_decay or decay_limit_randomization (or a dotted path)."""
    reuse_cooldown_time: float | None = Field(None, ge=0)
    """Seconds from an item's read until it may be read again; None: never reused."""
    priority_fn_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the priority fn (decay 2.0, use_count_limit, sigma)."""

    _known_priority_fn = field_validator("priority_fn")(check_priority_fn)


REPLAY_KEYS = ("use_priority_queue", "priority_fn", "reuse_cooldown_time", "priority_fn_args")


class StorageConfig(Section):
    name: str = ""
    """Buffer name (unique)."""
    storage_type: Literal["file", "queue", "sql"] = "file"
    """file: jsonl/parquet/HF dir; queue: fifo or priority queue; sql: persistent table."""
    path: str | None = None
    """file: data file or directory; queue/sql: optional SQLite file (default under the run dir)."""
    subset_name: str | None = None
    """HF-layout subset (sub-directory)."""
    split: str = "train"
    """HF-layout split (file name prefix)."""
    repeat_times: int | None = Field(None, ge=1)
    """Rollouts per task: a training taskset's is algorithm.repeat_times (a different value is refused);
    an eval taskset's defaults to 1 (services/common/config/tasksets.py decides every taskset setting)."""
    format: FormatConfig = FormatConfig()
    """Column names."""
    rollout_args: dict[str, Any] = Field(default_factory=dict)
    """Sampling arguments (temperature, top_p, top_k, max_tokens, logprobs)."""
    workflow_args: dict[str, Any] = Field(default_factory=dict)
    """Extra workflow arguments."""
    reward_fn_args: dict[str, Any] = Field(default_factory=dict)
    """Extra reward-function arguments."""
    default_workflow_type: str | None = None
    """Workflow for this taskset; unset: explorer_input.default_eval_workflow_type (eval tasksets), then
    explorer_input.default_workflow_type, then buffer.default_workflow_type."""
    default_reward_fn_type: str | None = None
    """Reward fn for this taskset; unset: explorer_input.default_reward_fn_type, then
    buffer.default_reward_fn_type."""
    task_selector: TaskSelectorConfig = TaskSelectorConfig()
    """Task order."""
    data_selector: TaskSelectorConfig | None = None
    """Trinity v0.5's name of task_selector (give one of them)."""
    total_epochs: int | None = Field(None, ge=1)
    """Epochs of this taskset (falls back to buffer.total_epochs)."""
    total_steps: int | None = Field(None, ge=1)
    """Batches of this taskset (falls back to buffer.total_steps)."""
    max_read_timeout: float = Field(1800.0, ge=0)
    """Seconds a read waits to fill its batch before returning a partial one."""
    use_priority_queue: bool = False
    """queue: a priority queue instead of fifo."""
    reuse_cooldown_time: float | None = Field(None, ge=0)
    """Priority queue: seconds from an item's read until it may be read again; None: never reused."""
    priority_fn: str = "linear_decay"
    """Priority queue: linear_decay or decay_limit_randomization."""
    priority_fn_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the priority fn (decay, use_count_limit, sigma)."""
    capacity: int | None = Field(None, ge=1)
    """Max experiences; fifo: all stored ones, writers wait when full; priority: the ones queued
    (not those read and leased or cooling down), the lowest priority evicted."""
    enable_progress_bar: bool = False
    """Accepted for Trinity compatibility; progress is logged instead."""
    schema_type: Literal["sft", "dpo"] | None = None
    """Trinity's row schema of a dataset buffer the trainer reads: sft (prompt/response or messages
    rows) or dpo (preference pairs: chosen_key and rejected_key); a row of the other kind is an
    error naming it (None: each row's columns decide). Trinity's experience schema is rejected."""
    replay_buffer: ReplayBufferConfig | None = None
    """Trinity v0.5's grouping of the priority-queue keys (give it or the flat keys, not both)."""

    _known_priority_fn = field_validator("priority_fn")(check_priority_fn)

    @model_validator(mode="after")
    def _one_spelling(self) -> StorageConfig:
        if self.data_selector is not None and "task_selector" in self.model_fields_set:
            raise ValueError("task_selector and data_selector are the same setting; give one of them")
        flat = sorted(set(REPLAY_KEYS) & self.model_fields_set)
        if self.replay_buffer is not None and flat:
            raise ValueError(
                f"replay_buffer and {', '.join(flat)} are the same settings; give replay_buffer or the flat keys"
            )
        return self

    @property
    def selector(self) -> TaskSelectorConfig:
        """The task order: data_selector (Trinity v0.5) or task_selector."""
        return self.data_selector if self.data_selector is not None else self.task_selector

    @property
    def replay(self) -> ReplayBufferConfig:
        """The priority-queue settings, from replay_buffer or the flat keys."""
        if self.replay_buffer is not None:
            return self.replay_buffer
        return ReplayBufferConfig(
            enable=self.use_priority_queue,
            priority_fn=self.priority_fn,
            reuse_cooldown_time=self.reuse_cooldown_time,
            priority_fn_args=self.priority_fn_args,
        )


MIX_NAME = "tasksets"
"""The buffer name under which the explorer reads the mixed batches of buffer.explorer_input.tasksets
(services/buffer/kinds/mix.py); no taskset may be named so."""


class ExplorerInputConfig(Section):
    taskset: StorageConfig | None = None
    """Training taskset."""
    tasksets: list[StorageConfig] = Field(default_factory=list)
    """Several training tasksets (Trinity's TasksetScheduler; give this or taskset, not both): each
    batch mixes them in proportion to their sizes, the order of sets shuffled per epoch, and each
    set's task_selector picks its tasks (services/buffer/kinds/mix.py). Each task keeps its set's
    workflow, reward fn, format and rollout_args; an unnamed set is taskset_<i>. File tasksets only;
    epochs and steps are buffer.total_epochs / total_steps (a set's own are refused)."""
    eval_tasksets: list[StorageConfig] = Field(default_factory=list)
    """Evaluation tasksets."""
    default_workflow_type: str | None = None
    """Workflow of a taskset that names none (before buffer.default_workflow_type)."""
    default_eval_workflow_type: str | None = None
    """Workflow of an eval taskset that sets none (before default_workflow_type; Trinity's key)."""
    default_reward_fn_type: str | None = None
    """Reward fn of a taskset that names none (before buffer.default_reward_fn_type)."""

    @model_validator(mode="after")
    def _training_tasksets(self) -> ExplorerInputConfig:
        if self.taskset is not None and self.tasksets:
            raise ValueError(
                "buffer.explorer_input.tasksets: taskset and tasksets are both set (Trinity refuses it "
                "too); give one taskset as taskset, or list them all under tasksets"
            )
        seen: set[str] = set()
        for i, ts in enumerate(self.tasksets):
            key = f"buffer.explorer_input.tasksets[{i}]"
            if ts.storage_type != "file":
                raise ValueError(
                    f"{key}.storage_type: {ts.storage_type!r}; mixed training tasksets are read from files "
                    "(jsonl/parquet/dataset directory), as Trinity's TasksetScheduler: use storage_type file"
                )
            name = ts.name or f"taskset_{i}"  # an unnamed one's name (services/common/config/tasksets.py)
            if name in seen:
                raise ValueError(f"{key}.name: {name!r} names two tasksets; give each its own name")
            seen.add(name)
        sets = ([self.taskset] if self.taskset else []) + self.tasksets + self.eval_tasksets
        if any(ts.name == MIX_NAME for ts in sets):
            raise ValueError(
                f"buffer.explorer_input: no taskset may be named {MIX_NAME!r} (the explorer reads the "
                "mixed batches of tasksets under that name); rename it"
            )
        return self

    def training_tasksets(self) -> list[tuple[str, StorageConfig]]:
        """(key path, section) of each training taskset: taskset, or the items of tasksets."""
        if self.taskset is not None:
            return [("buffer.explorer_input.taskset", self.taskset)]
        return [(f"buffer.explorer_input.tasksets[{i}]", ts) for i, ts in enumerate(self.tasksets)]

    @property
    def training_reader(self) -> str:
        """The taskset name the explorer reads its batches from: the one taskset's (default
        `taskset`), or MIX_NAME for tasksets; "" when there is none."""
        if self.taskset is not None:
            return self.taskset.name or "taskset"
        return MIX_NAME if self.tasksets else ""


EXPERIENCE_BUFFER = "experience_buffer"
"""The experience buffer's name when its section names none (the loader resolves "" to it: resolve.py)."""


class TrainerInputConfig(Section):
    experience_buffer: StorageConfig = StorageConfig(name=EXPERIENCE_BUFFER, storage_type="queue")
    """Where the explorer writes and the trainer reads."""
    auxiliary_buffers: dict[str, StorageConfig] = Field(default_factory=dict)
    """Extra buffers (SFT data for mix, ...)."""
    sft_warmup_dataset: StorageConfig | None = None
    """Accepted for older Trinity configs: an SFT dataset for warm-up."""


class BufferConfig(Section):
    batch_size: int = Field(1, ge=1)
    """Tasks per explorer step (not multiplied by repeat_times)."""
    train_batch_size: int | None = Field(None, ge=1)
    """Experiences per training step; defaults to batch_size * algorithm.repeat_times."""
    total_epochs: int = Field(1, ge=1)
    """Epochs over the taskset."""
    total_steps: int | None = Field(None, ge=1)
    """Steps; overrides total_epochs when set."""
    explorer_input: ExplorerInputConfig = ExplorerInputConfig()
    """Tasksets."""
    trainer_input: TrainerInputConfig = TrainerInputConfig()
    """Experience buffers."""
    default_workflow_type: str | None = None
    """Older spelling: the workflow of a taskset when neither it nor explorer_input names one."""
    default_reward_fn_type: str | None = None
    """Older spelling: the reward fn of a taskset when neither it nor explorer_input names one."""
    data_dir: str | None = None
    """Where the buffer service keeps its SQLite files; default <run dir>/buffer."""
    lease_s: float = Field(600.0, gt=0)
    """Default lease of a read, in seconds, before unacked items come back."""
    max_batch_items: int = Field(4096, ge=1)
    """Largest number of experiences in one Write or Read; more is INVALID_ARGUMENT."""

    @model_validator(mode="after")
    def _mixed_epochs(self) -> BufferConfig:
        for i, ts in enumerate(self.explorer_input.tasksets):
            for key in ("total_epochs", "total_steps"):
                own, mix = getattr(ts, key), getattr(self, key)
                if own is not None and own != mix:
                    raise ValueError(
                        f"buffer.explorer_input.tasksets[{i}].{key}: {own}; the mixed tasksets run "
                        f"buffer.{key} ({mix}) together (Trinity overrides a set's own): set buffer.{key} "
                        "and remove the taskset's key"
                    )
        return self
