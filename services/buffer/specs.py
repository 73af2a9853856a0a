"""Which buffers the config declares, and the defaults they fall back to.

- `buffer.explorer_input.taskset` -> taskset; `eval_tasksets` -> tasksets with is_eval;
- `buffer.explorer_input.tasksets` -> a taskset each, read together as the mix `tasksets`
  (MixSpec, services/buffer/kinds/mix.py);
- `buffer.trainer_input.experience_buffer`: storage_type queue -> fifo (priority when
  use_priority_queue), sql -> table, file -> taskset (a dataset of rows, as in Trinity's SFT/DPO
  stages: the trainer reads the rows with ReadTasks and tokenizes them itself);
- `auxiliary_buffers` (and the legacy `sft_warmup_dataset`): file -> taskset, queue/sql as above.

What a taskset falls back to (workflow, reward fn, repeat_times, ...) is decided in one place,
services/common/config/tasksets.py; the buffer hands the result out on every Task.
"""

from __future__ import annotations

import os

from services.buffer.core import BufferSpec, Defaults
from services.buffer.types import MixSpec
from services.common.config.buffer import StorageConfig
from services.common.config.schema import TrinityConfig
from services.common.config.tasksets import TasksetDefaults


def data_dir(cfg: TrinityConfig) -> str:
    """cfg.buffer.data_dir, else <run dir>/buffer."""
    return cfg.buffer.data_dir or os.path.join(cfg.run_dir, "buffer")


def defaults_from_config(cfg: TrinityConfig) -> Defaults:
    return Defaults(
        lease_s=cfg.buffer.lease_s,
        max_batch_items=cfg.buffer.max_batch_items,
        tasksets=TasksetDefaults.from_config(cfg),
    )


def spec_of(
    st: StorageConfig, *, name: str | None = None, is_eval: bool = False, file_kind: str = "taskset"
) -> BufferSpec:
    if st.storage_type == "file":
        kind = file_kind
    elif st.storage_type == "sql":
        kind = "table"
    else:
        kind = "priority" if st.replay.enable else "fifo"
    options = st.model_dump(mode="json", exclude_defaults=True, exclude={"name"})
    if is_eval:
        options["is_eval"] = True
    return BufferSpec(name or st.name, kind, options)


def specs_from_config(cfg: TrinityConfig) -> list[BufferSpec]:
    b = cfg.buffer
    specs: list[BufferSpec] = []
    if b.explorer_input.taskset is not None:
        specs.append(spec_of(b.explorer_input.taskset, name=b.explorer_input.taskset.name or "taskset"))
    for i, ts in enumerate(b.explorer_input.tasksets):
        specs.append(spec_of(ts, name=ts.name or f"taskset_{i}"))
    for i, ts in enumerate(b.explorer_input.eval_tasksets):
        specs.append(spec_of(ts, name=ts.name or f"eval_taskset_{i}", is_eval=True))
    ti = b.trainer_input
    specs.append(spec_of(ti.experience_buffer, name=ti.experience_buffer.name))
    for key, aux in ti.auxiliary_buffers.items():
        specs.append(spec_of(aux, name=aux.name or key))
    if ti.sft_warmup_dataset is not None:
        specs.append(spec_of(ti.sft_warmup_dataset, name=ti.sft_warmup_dataset.name or "sft_warmup_dataset"))
    return specs


def mixes_from_config(cfg: TrinityConfig) -> list[MixSpec]:
    """The mix of buffer.explorer_input.tasksets, when it lists any."""
    b, inputs = cfg.buffer, cfg.buffer.explorer_input
    if not inputs.tasksets:
        return []
    members = [ts.name or f"taskset_{i}" for i, ts in enumerate(inputs.tasksets)]
    return [MixSpec(inputs.training_reader, members, b.total_epochs, b.total_steps)]
