"""Datasets as training data: rows of a file-backed buffer, tokenized by the trainer.

Trinity's SFT (and mix's expert data) read a dataset file rather than experiences produced by an
explorer. Here the buffer serves such a file as a taskset (storage_type `file`); this source reads
its rows with ReadTasks and turns each into an Experience with the trainer's own tokenizer
(dataset_rows.py: plaintext and messages rows for SFT, preference pairs for DPO, and under
algorithm_type cpt plain text rows, every token trained on).
ReadTasks has no lease: the buffer advances its per-reader cursor
when it hands the rows out, so `ack`/`nack` are no-ops for these reads.
"""

from __future__ import annotations

from typing import Any

from services.common.config.buffer import FormatConfig, StorageConfig
from services.common.config.schema import TrinityConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience, Task
from services.trainer.dataset_rows import ChatStyle, text_row, tokenize_row


def dataset_buffers(cfg: TrinityConfig) -> dict[str, StorageConfig]:
    """Buffer name -> storage config for every trainer input that is a file dataset."""
    ti = cfg.buffer.trainer_input
    found = {}
    if ti.experience_buffer.storage_type == "file":
        found[ti.experience_buffer.name] = ti.experience_buffer
    for key, aux in ti.auxiliary_buffers.items():
        if aux.storage_type == "file":
            found[aux.name or key] = aux
    return found


class DatasetAwareSource:
    """The trainer's ExperienceSource: dataset buffers through ReadTasks + tokenizer, others as experiences."""

    def __init__(self, buffer: Any, tokenizer: Any, cfg: TrinityConfig) -> None:
        self.buffer = buffer
        self.tokenizer = tokenizer
        self.datasets = dataset_buffers(cfg)
        self.text_rows = cfg.algorithm.algorithm_type == "cpt"  # continued pre-training: text rows
        self.chat = {
            name: ChatStyle.of(storage.format, cfg.model.custom_chat_template, cfg.model.enable_thinking)
            for name, storage in self.datasets.items()
        }

    async def read(self, buffer: str, batch_size: int, **kwargs: Any) -> Any:
        if buffer not in self.datasets:
            return await self.buffer.read(buffer, batch_size, **kwargs)
        batch = await self.buffer.read_tasks(buffer, batch_size, reader_id=kwargs.get("reader_id", ""))
        storage = self.datasets[buffer]
        exps = [self._experience(task, storage.format, buffer, storage.schema_type) for task in batch.tasks]
        return _DatasetRead(lease_id="", experiences=exps, end_of_data=batch.end_of_data)

    def _experience(self, task: Task, fmt: FormatConfig, buffer: str, schema: str | None) -> Experience:
        where = f"{buffer}[{task.index}]"
        if self.text_rows:
            exp = text_row(task.raw_task, fmt, self.tokenizer, where=where)
            exp.task_id, exp.batch_id = task.task_id, task.index
            return exp
        exp = tokenize_row(task.raw_task, fmt, self.tokenizer, where=where, chat=self.chat[buffer])
        kind = "dpo" if exp.chosen is not None else "sft"
        if schema is not None and kind != schema:
            wanted = "chosen/rejected columns" if schema == "dpo" else "a prompt and one response"
            raise InvalidArgument(
                f"schema_type {schema}: the row needs {wanted}, got a {kind} row (keys: {sorted(task.raw_task)})",
                field=where,
            )
        exp.task_id, exp.batch_id = task.task_id, task.index
        return exp

    async def ack(self, lease_id: str) -> Any:
        return await self.buffer.ack(lease_id) if lease_id else None

    async def nack(self, lease_id: str) -> Any:
        return await self.buffer.nack(lease_id) if lease_id else None

    async def nack_reader(self, buffer: str, reader_id: str) -> int:
        """Dataset buffers hold no leases (their cursor moved when the rows were handed out): 0."""
        return 0 if buffer in self.datasets else int(await self.buffer.nack_reader(buffer, reader_id))


class _DatasetRead:
    def __init__(self, lease_id: str, experiences: list[Experience], end_of_data: bool) -> None:
        self.lease_id = lease_id
        self.experiences = experiences
        self.end_of_data = end_of_data
