"""The environment `trinity run` gives its children: torch threads per worker (half the cores, every
core for a worker computing alone or for workers that take turns), no progress bars, unbuffered output."""

from __future__ import annotations

import os
import pathlib

import pytest

from services.cli import prepare
from services.cli.prepare import pinned_cpus
from services.common.config import load_config
from services.common.errors import ConfigError

# ---- child_env -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("cores", "threads"), [(8, "4"), (2, "1"), (3, "1"), (1, "1"), (None, "1")])
def test_torch_threads_default_to_half_the_cores_at_least_one(
    monkeypatch: pytest.MonkeyPatch, cores: int | None, threads: str
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert prepare.child_env()["OMP_NUM_THREADS"] == threads


@pytest.mark.parametrize(("cores", "threads"), [(8, "8"), (2, "2"), (1, "1"), (None, "2")])
def test_a_worker_computing_alone_gets_every_core(
    monkeypatch: pytest.MonkeyPatch, cores: int | None, threads: str
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert prepare.child_env(alone=True)["OMP_NUM_THREADS"] == threads


def test_the_users_thread_count_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert prepare.child_env()["OMP_NUM_THREADS"] == "3"
    assert prepare.child_env(alone=True)["OMP_NUM_THREADS"] == "3"


def test_children_get_no_progress_bars_unbuffered_output_and_the_rest_of_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("PYTHONUNBUFFERED", "0")  # forced on: the console reads the children's lines live
    monkeypatch.setenv("TRINITY_TEST_MARKER", "kept")
    env = prepare.child_env()
    assert env["TQDM_DISABLE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["TRINITY_TEST_MARKER"] == "kept"
    assert all(
        env[k] == v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"
    )  # the rest passes through


def test_the_trainer_gets_a_fixed_mmap_threshold_unless_the_user_set_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert prepare.child_env(service="trainer")["MALLOC_MMAP_THRESHOLD_"] == "131072"
    assert "MALLOC_MMAP_THRESHOLD_" not in prepare.child_env(service="explorer")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert prepare.child_env(service="trainer")["MALLOC_MMAP_THRESHOLD_"] == "1048576"


@pytest.mark.parametrize(
    ("overrides", "turns"),
    [
        ([], True),  # strictly on-policy, a real model
        (["synchronizer.sync_offset=1"], False),  # generation overlaps training
        (["synchronizer.sync_interval=2"], False),
        (["synchronizer.sync_style=dynamic_by_explorer"], False),
        (["mode=train"], False),
        (["model.model_path=builtin:tiny-arith"], False),  # too small for a second thread to pay
    ],
)
def test_workers_that_take_turns_on_a_real_model_each_get_every_core(
    overrides: list[str], turns: bool, tmp_path: pathlib.Path
) -> None:
    base = [
        "model.model_path=/models/SmolLM2-135M-Instruct",
        "synchronizer.sync_offset=0",  # the embedded default's is 1
        f"checkpoint_root_dir={tmp_path}",
    ]
    assert prepare.takes_turns(load_config(None, [*base, *overrides])) is turns


def test_pinned_cpus_reads_labels_ranges_and_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    spec = "trainer=0, explorer=1-2,explorer-2=1+3"
    assert pinned_cpus("trainer", spec) == [0]
    assert pinned_cpus("explorer", spec) == [1, 2]
    assert pinned_cpus("explorer-2", spec) == [1, 3]
    assert pinned_cpus("buffer", spec) is None
    assert pinned_cpus("trainer", "") is None
    monkeypatch.setenv("TRINITY_PIN_CPUS", "trainer=3")
    assert pinned_cpus("trainer") == [3]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("trainer", "not LABEL=CPUS"),
        ("trainer=x", "not a CPU number"),
        ("trainer=7", "may not use"),
        ("=1", "LABEL"),
    ],
)
def test_a_bad_pin_spec_names_the_variable(monkeypatch: pytest.MonkeyPatch, spec: str, message: str) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(ConfigError, match=message) as info:
        pinned_cpus("trainer", spec)
    assert info.value.field == "TRINITY_PIN_CPUS"


def test_explorer_replicas_get_their_own_name_ports_and_no_evals() -> None:
    cfg = load_config(None, ["explorer.replicas=3", "services.explorer.metrics_port=9454"])
    items = dict(item.split("=", 1) for item in prepare.replica_overrides(cfg, 3))
    assert items["explorer.name"] == "explorer-3"
    assert int(items["services.explorer.port"]) not in (0, cfg.services.explorer.port)
    assert int(items["services.explorer.metrics_port"]) != 9454
    assert items["buffer.explorer_input.eval_tasksets"] == "[]"
    plain = dict(item.split("=", 1) for item in prepare.replica_overrides(load_config(None), 2))
    assert "services.explorer.metrics_port" not in plain


def test_a_pinned_child_runs_under_taskset_with_a_thread_per_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv("TRINITY_PIN_CPUS", "explorer=0+1")
    env = {"OMP_NUM_THREADS": "1"}
    assert prepare.pin_prefix("explorer", env) == ["taskset", "-c", "0,1"] and env["OMP_NUM_THREADS"] == "2"
    assert prepare.pin_prefix("trainer", env) == [] and env["OMP_NUM_THREADS"] == "2"
