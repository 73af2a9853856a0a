"""Fakes of the buffer and synchronizer clients for the explorer's unit tests (same method names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from services.common.experience import Task


@dataclass
class FakeBuffer:
    tasksets: dict[str, list[dict]]
    batch_size_override: int | None = None
    cursors: dict[tuple[str, str], int] = field(default_factory=dict)
    written: dict[str, list] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    feedback: list = field(default_factory=list)
    writers: dict[str, set] = field(default_factory=dict)
    closed: list = field(default_factory=list)

    async def read_tasks(self, taskset, batch_size, reader_id="", rewind=False):
        key = (taskset, reader_id)
        if rewind:
            self.cursors[key] = 0
        pos = self.cursors.get(key, 0)
        rows = self.tasksets[taskset]
        is_eval = taskset.startswith("eval")
        chunk = rows[pos : pos + batch_size]
        if not is_eval and len(chunk) < batch_size:
            chunk = []
        self.cursors[key] = pos + len(chunk)
        tasks = [Task(raw_task=r, task_id=str(pos + i), index=pos + i, taskset=taskset, is_eval=is_eval) for i, r in enumerate(chunk)]
        end = not chunk or self.cursors[key] >= len(rows)
        return SimpleNamespace(tasks=tasks, epoch=0, batch_index=pos // batch_size, end_of_data=end and not chunk)

    async def write(self, buffer, experiences, idempotency_key="", writer_id=""):
        if idempotency_key in self.keys:
            return 0
        self.keys.add(idempotency_key)
        self.written.setdefault(buffer, []).extend(experiences)
        return len(experiences)

    async def report_task_feedback(self, taskset, feedback):
        self.feedback.append((taskset, dict(feedback)))

    async def open_writer(self, buffer, writer_id):
        self.writers.setdefault(buffer, set()).add(writer_id)

    async def close_writer(self, buffer, writer_id):
        self.closed.append((buffer, writer_id))


@dataclass
class FakeSync:
    """Tells the explorer to load `plan[step]` (a (version, path) pair) before that step."""

    plan: dict[int, tuple[int, str]] = field(default_factory=dict)
    asked: list = field(default_factory=list)
    reports: list = field(default_factory=list)

    async def begin_explorer_step(self, member_id, step, model_version):
        self.asked.append((step, model_version))
        if step in self.plan:
            version, path = self.plan[step]
            return SimpleNamespace(must_sync=True, load_version=SimpleNamespace(version=version, checkpoint_path=path))
        return SimpleNamespace(must_sync=False, load_version=None)

    async def report_sync(self, member_id, version, ok, error=""):
        self.reports.append((version, ok, error))


class RecordingMonitor:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []

    def log(self, metrics, step):
        self.logged.append((step, dict(metrics)))

    def close(self):
        pass
