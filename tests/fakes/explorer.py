"""Fakes of the buffer and synchronizer clients for the explorer's unit tests (same method names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from services.common.config.schema import TrinityConfig
from services.common.config.tasksets import TasksetDefaults, effective_taskset, task_settings
from services.common.errors import AlreadyExists, FailedPrecondition
from services.common.experience import Task
from services.common.wire import experience_to_proto


@dataclass
class FakeBuffer:
    tasksets: dict[str, list[dict]]
    batch_size_override: int | None = None
    cursors: dict[tuple[str, str], int] = field(default_factory=dict)
    previous: dict[tuple[str, str], int] = field(default_factory=dict)
    written: dict[str, list] = field(default_factory=dict)
    keys: dict[str, list[bytes]] = field(default_factory=dict)  # idempotency key -> content
    feedback: list = field(default_factory=list)
    writers: dict[str, set] = field(default_factory=dict)
    closed: list = field(default_factory=list)
    reads: list = field(default_factory=list)  # (taskset, batch_size) of every read_tasks
    extensions: list = field(default_factory=list)  # (taskset, batch index) of every extend read
    index: dict[tuple[str, str], int] = field(default_factory=dict)  # batch index last handed
    cfg: TrinityConfig | None = None  # when set, tasks carry the settings the real buffer would give

    def _settings(self, taskset: str, is_eval: bool) -> dict:
        if self.cfg is None:
            return {}
        inputs = self.cfg.buffer.explorer_input
        section = next(ts for ts in [inputs.taskset, *inputs.eval_tasksets] if ts and ts.name == taskset)
        defaults = TasksetDefaults.from_config(self.cfg)
        return task_settings(effective_taskset(section, defaults, is_eval=is_eval))

    async def read_tasks(
        self, taskset, batch_size, reader_id="", rewind=False, repeat_last=False, extend=False
    ):
        """As the buffer's taskset, with one epoch: the next batch (or the same one: repeat_last),
        or more tasks for the last batch under its index (extend: the cursor moves, the position
        repeat_last goes back to stays)."""
        self.reads.append((taskset, batch_size))
        key = (taskset, reader_id)
        repeat = repeat_last and key in self.previous and not rewind
        if extend:
            if key not in self.index:
                raise FailedPrecondition(f"{reader_id!r} was handed no batch to extend")
            self.extensions.append((taskset, self.index[key]))
        else:
            self.cursors[key] = 0 if rewind else self.previous[key] if repeat else self.cursors.get(key, 0)
            self.previous[key] = self.cursors[key]
            known = key in self.index and not rewind  # else: a cursor a test set, at a batch boundary
            step_on = 0 if repeat else 1
            self.index[key] = self.index[key] + step_on if known else self.cursors[key] // batch_size
        pos = self.cursors.get(key, 0)
        rows = self.tasksets[taskset]
        is_eval = taskset.startswith("eval")
        chunk = rows[pos : pos + batch_size]
        if not is_eval and len(chunk) < batch_size:
            chunk = []
        self.cursors[key] = pos + len(chunk)
        tasks = [
            Task(
                raw_task=r,
                task_id=str(pos + i),
                index=pos + i,
                taskset=taskset,
                is_eval=is_eval,
                **self._settings(taskset, is_eval),
            )
            for i, r in enumerate(chunk)
        ]
        end = not chunk or self.cursors[key] >= len(rows)
        return SimpleNamespace(
            tasks=tasks, epoch=0, batch_index=self.index[key], end_of_data=end and not chunk
        )

    async def write(self, buffer, experiences, idempotency_key="", writer_id=""):
        """As the buffer: a known key stores nothing; with other content it is AlreadyExists."""
        content = [experience_to_proto(e).SerializeToString(deterministic=True) for e in experiences]
        if idempotency_key in self.keys:
            if self.keys[idempotency_key] != content:
                raise AlreadyExists(f"idempotency key {idempotency_key!r}: the content differs")
            return 0
        self.keys[idempotency_key] = content
        self.written.setdefault(buffer, []).extend(experiences)
        return len(experiences)

    async def report_task_feedback(self, taskset, feedback):
        self.feedback.append((taskset, dict(feedback)))

    async def open_writer(self, buffer, writer_id):
        self.writers.setdefault(buffer, set()).add(writer_id)

    async def close_writer(self, buffer, writer_id):
        self.closed.append((buffer, writer_id))


class FakeWeightSync:
    """Loads `plan[step]` (version, checkpoint dir) into every engine before that step."""

    def __init__(self, pool, plan=None):
        from services.explorer.weight_sync import EngineWeights

        self.engines = EngineWeights(pool)
        self.plan = plan or {}
        self.asked: list[int] = []
        self.loaded: list[int] = []
        self.left_after: list[int] | None = None  # the steps asked when leave() was called

    async def before_step(self, step):
        self.asked.append(step)
        if step not in self.plan:
            return None
        version, path = self.plan[step]
        await self.engines.load_path(version, path)
        self.loaded.append(version)
        return version

    async def load_path(self, version, path):
        await self.engines.load_path(version, path)
        self.loaded.append(version)

    async def leave(self):
        self.left_after = list(self.asked)

    def during_step(self, step, on_loaded):
        return self.engines.during_step(step, on_loaded)


class RecordingMonitor:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []

    def log(self, metrics, step):
        self.logged.append((step, dict(metrics)))

    def close(self):
        pass


class FakeSyncClient:
    """The synchronizer client's calls a mid-step load makes: wait_for_version, report_sync."""

    def __init__(self):
        import asyncio

        self.member_id = "explorer"
        self.held = 0
        self.latest = None  # the published version (a ledger.Version), once publish() set it
        self.published = asyncio.Event()
        self.waited_for: list[int] = []
        self.reports: list[tuple[int, bool]] = []

    def publish(self, version):
        self.latest = version
        self.published.set()

    async def wait_for_version(self, min_version, timeout=None):
        self.waited_for.append(min_version)
        while self.latest is None or self.latest.version < min_version:
            self.published.clear()
            await self.published.wait()
        return self.latest

    async def report_sync(self, version, ok, error=""):
        self.reports.append((version, ok))
        if ok:
            self.held = version


class FakeReceiver:
    """WeightReceiver.receive: hands `tensors` for any version and reports the transfer."""

    def __init__(self, client, tensors):
        self.client = client
        self.tensors = tensors

    async def receive(self, version, into=None):
        await self.client.report_sync(version.version, True)
        return dict(self.tensors)
