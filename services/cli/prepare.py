"""What `trinity run` does before it starts a stage's children: free ports for port-0 endpoints, the
resolved config the children read, their environment (threads per child), the preflight checks that
fail before anything starts, the embedded demo's data files, the overrides of a fresh run, and the
experience writers reopened for a run that continues. Also `say`, the runner's own output line.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

import yaml

from services.common.config import TrinityConfig
from services.common.config.services import Endpoint
from services.common.errors import ConfigError, TrinityError
from services.common.parent_watch import PARENT_ENV
from services.common.procs import free_port

INFRA = ("buffer", "synchronizer")
WORKERS_OF_MODE = {
    "both": ("trainer", "explorer"),
    "train": ("trainer",),
    "explore": ("explorer",),
    "bench": (),
    "serve": ("explorer",),  # the explorer is the OpenAI-compatible proxy (services/explorer/serve/)
    "colocate": ("trainer", "explorer"),  # one copy of the weights between them (docs/colocate.md)
}
LABEL_WIDTH = 12  # the [name] column of the runner's and its children's output lines


def say(message: str, *, err: bool = False) -> None:
    print(f"[{'run':<{LABEL_WIDTH}}] {message}", file=sys.stderr if err else sys.stdout, flush=True)


def resolve_ports(cfg: TrinityConfig) -> TrinityConfig:
    """Give every endpoint with port 0 a free port, so children and clients agree on it (a
    metrics_port 0 too, so the resolved config says where each service's /metrics is)."""
    updates = {}
    for name in ("buffer", "synchronizer", "trainer", "explorer"):
        endpoint = cfg.services.endpoint(name)
        update = {key: free_port() for key in ("port", "metrics_port") if getattr(endpoint, key) == 0}
        if update:
            updates[name] = endpoint.model_copy(update=update)
    if not updates:
        return cfg
    return cfg.model_copy(update={"services": cfg.services.model_copy(update=updates)})


def write_resolved_config(cfg: TrinityConfig, path: str) -> None:
    data = cfg.model_dump(mode="json", exclude={"stages"})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)


TRAINER_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}
"""glibc keeps freed blocks below its dynamic mmap threshold (which grows to 32 MiB: every activation
of a small model) in the heap, and the trainer's resident set climbs step after step as the blocks
fragment: SmolLM2-135M's GRPO job, 4 steps, 5.3 -> 11.3 GiB. A fixed threshold of 128 KiB hands
every larger tensor back to the kernel when freed: 5.5 GiB, flat (docs/colocate.md, "Measured");
forward + backward ~3 % slower (benchmarks/colocate_weights.py run with and without it)."""


def child_env(*, alone: bool = False, service: str = "") -> dict[str, str]:
    """The children's environment: no tqdm bars, unbuffered output, and (unless the user set
    OMP_NUM_THREADS) torch threads = cores / 2, so the trainer and the explorer of one machine do not
    fight over the cores (on a 2-core box, 1 thread each was several times faster than 2); a worker
    that computes `alone` (a train or explore stage, the bench explorer) gets every core (the demo's
    SFT stage: 150 steps in 55 s instead of 73 s on 2 cores). The trainer also gets TRAINER_MALLOC
    (unless the user set it)."""
    cores = os.cpu_count() or 2
    threads = str(cores if alone else max(1, cores // 2))
    malloc = TRAINER_MALLOC if service == "trainer" else {}
    env = {"TQDM_DISABLE": "1", "OMP_NUM_THREADS": threads, **malloc, **os.environ, "PYTHONUNBUFFERED": "1"}
    env[PARENT_ENV] = str(os.getpid())  # children stop if this process dies (parent_watch.py)
    return env


def takes_turns(cfg: TrinityConfig) -> bool:
    """Trainer and explorer of this stage compute in turn, never at once, on a real model: strictly
    on-policy (sync every step, no offset, fixed style), so each can have every core (`alone`).

    SmolLM2-135M on 2 cores, one thread each -> two: rollout of 64 samples 31 -> 21 s, update
    33 -> 22 s. The builtin tiny models are left at half the cores each: their ops are too small
    for a second thread to pay."""
    sync = cfg.synchronizer
    return (
        cfg.mode in ("both", "colocate")
        and sync.sync_interval == 1
        and sync.sync_offset == 0
        and sync.sync_style == "fixed"
        and not cfg.model.model_path.startswith("builtin:")
    )


def preflight(cfg: TrinityConfig) -> None:
    """Fail before starting anything when a stage's algorithm parts reject their arguments (every
    problem of preflight_problems, the first one's key as the field)."""
    problems = preflight_problems(cfg)
    if problems:
        raise ConfigError("\n".join(str(p.message) for p in problems), field=problems[0].field)


def preflight_problems(cfg: TrinityConfig) -> list[ConfigError]:
    """What `trinity run` would refuse before starting anything: one machine, a bench stage with eval
    tasksets, and each training stage's algorithm building with its arguments."""
    from services.trainer.algorithms.builder import build_algorithm

    problems = []
    if cfg.cluster.node_num != 1:
        problems.append(
            ConfigError(
                f"cluster.node_num {cfg.cluster.node_num}: one `trinity run` drives one machine (only 1); "
                "across machines, start each service where it should run and point services.* at them",
                field="cluster.node_num",
            )
        )
    for index, stage in enumerate(cfg.stage_configs):
        where = f"stages[{index}] ({cfg.stages[index].stage_name}): " if cfg.stages else ""
        prefix = f"stages[{index}]." if cfg.stages else ""
        if stage.mode == "bench" and not stage.buffer.explorer_input.eval_tasksets:
            problems.append(
                ConfigError(
                    f"{where}mode bench scores the eval tasksets, and there are none; "
                    "add buffer.explorer_input.eval_tasksets",
                    field=f"{prefix}buffer.explorer_input.eval_tasksets",
                )
            )
        if "trainer" not in WORKERS_OF_MODE[stage.mode]:
            continue
        try:
            build_algorithm(stage.algorithm)
        except TrinityError as exc:
            field = f"{prefix}{exc.field}" if exc.field else exc.field
            problems.append(ConfigError(f"{where}{exc}", field=field))
    return problems


def prepare_data(cfg: TrinityConfig) -> None:
    """Generate the embedded demo's data files when the config reads them and they are missing.

    The convention: files under `<checkpoint_root_dir>/<project>/demo_data/` are the demo's
    (services/cli/demo_data.py); any other missing path is the user's to provide.
    """
    from services.cli.demo_data import prepare_demo_data

    demo_dir = os.path.abspath(os.path.join(cfg.checkpoint_root_dir, cfg.project, "demo_data"))
    paths = []
    for stage in cfg.stage_configs:
        inputs = stage.buffer.explorer_input
        training = [section for _key, section in inputs.training_tasksets()]
        storages = [*training, *inputs.eval_tasksets, stage.buffer.trainer_input.experience_buffer]
        paths += [s.path for s in storages if s is not None and s.storage_type == "file" and s.path]
    if any(os.path.abspath(p).startswith(demo_dir + os.sep) and not os.path.exists(p) for p in paths):
        written = prepare_demo_data(demo_dir)
        say(f"demo data generated in {demo_dir}: {', '.join(os.path.basename(p) for p in written)}")


def fresh_run_overrides(cfg: TrinityConfig, overrides: Sequence[str]) -> list[str]:
    """Overrides that turn `continue_from_checkpoint: false` into a fresh `<name>_<timestamp>` run.

    The fresh run resumes within itself: a child the runner restarts (or a trainer whose stage
    is re-entered) must pick up this run's own checkpoints, not start over from the base weights
    under a step count that says otherwise.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return [*overrides, f"name={cfg.name}_{stamp}", "continue_from_checkpoint=true"]


def replica_overrides(cfg: TrinityConfig, index: int) -> tuple[str, ...]:
    """--set items of explorer replica `index` (2, 3, ...): its own member name, port and metrics
    port (when metrics are on); it scores no eval tasksets (the first explorer does, once per eval
    step)."""
    items: tuple[str, ...] = (
        f"explorer.name={cfg.explorer.name}-{index}",  # as explorer_names lists them
        f"services.explorer.port={free_port()}",
        "explorer.eval_on_startup=false",
        "buffer.explorer_input.eval_tasksets=[]",
    )
    if cfg.services.explorer.metrics_port is not None:
        items += (f"services.explorer.metrics_port={free_port()}",)
    return items


def explorer_names(cfg: TrinityConfig) -> list[str]:
    """The member names of the stage's explorers: explorer.name, then <name>-2, <name>-3, ... for
    explorer.replicas."""
    return [cfg.explorer.name, *(f"{cfg.explorer.name}-{i}" for i in range(2, cfg.explorer.replicas + 1))]


async def reopen_writers(cfg: TrinityConfig) -> None:
    """Mark the explorers' writers open on the experience buffer before the workers start.

    A run that continues (total_steps raised, or a stage stopped after its explorer finished) finds
    them closed by the last run's explorers; a trainer that read before its explorer was up would
    take that for the end of the data and stop at once. Each explorer opens its writer again itself.
    """
    from services.buffer.client import BufferClient

    name = cfg.buffer.trainer_input.experience_buffer.name  # resolved at load, as the explorer reads it
    async with await BufferClient.connect(cfg.services.buffer.address, services_cfg=cfg.services) as buffer:
        for writer in explorer_names(cfg):
            await buffer.open_writer(name, writer)


def child_endpoint(cfg: TrinityConfig, name: str, overrides: Sequence[str]) -> Endpoint:
    """Where a child of service `name` listens: its config's endpoint, or the port its --set items
    give it (an explorer replica's, from replica_overrides)."""
    endpoint = cfg.services.endpoint(name)  # type: ignore[arg-type]
    key = f"services.{name}.port="
    port = next((int(o[len(key) :]) for o in overrides if o.startswith(key)), None)
    return endpoint if port is None else endpoint.model_copy(update={"port": port})


PIN_ENV = "TRINITY_PIN_CPUS"


def pinned_cpus(label: str, spec: str | None = None) -> list[int] | None:
    """The CPUs child `label` is pinned to by $TRINITY_PIN_CPUS (`trainer=0,explorer=1`;
    `explorer=1-3` a range; `explorer=1+2` a list), or None (not pinned). Pinned children run under
    `taskset -c` with one torch thread per CPU: on one machine this stands for one device each."""
    spec = os.environ.get(PIN_ENV, "") if spec is None else spec
    found: list[int] | None = None
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, cpus = item.partition("=")
        if not sep or not name.strip() or not cpus.strip():
            raise ConfigError(f"{item!r} is not LABEL=CPUS (e.g. trainer=0,explorer=1)", field=PIN_ENV)
        try:
            chosen: list[int] = []
            for part in cpus.strip().split("+"):
                low, _, high = part.partition("-")
                chosen.extend(range(int(low), int(high or low) + 1))
        except ValueError:
            raise ConfigError(
                f"{cpus!r} of {name} is not a CPU number, range or list", field=PIN_ENV
            ) from None
        available = os.sched_getaffinity(0)
        if not chosen or not set(chosen) <= available:
            raise ConfigError(
                f"{name}={cpus} names CPUs this process may not use ({sorted(available)})", field=PIN_ENV
            )
        if name.strip() == label:
            found = chosen
    return found


def pin_prefix(label: str, env: dict[str, str]) -> list[str]:
    """The `taskset -c CPUS` prefix of child `label`'s command when $TRINITY_PIN_CPUS pins it (and
    one torch thread per pinned core in `env`: one device each, on one machine); [] when not pinned."""
    cpus = pinned_cpus(label)
    if cpus is None:
        return []
    env["OMP_NUM_THREADS"] = str(len(cpus))
    return ["taskset", "-c", ",".join(map(str, cpus))]
