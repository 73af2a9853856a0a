"""`trinity run` before any child starts: the children's environment, the demo data, the preflight
check of every stage's algorithm, free ports, and the resolved config each child reads."""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Callable, Iterator

import pytest
import yaml

from services.cli import demo_data, prepare, run
from services.cli.demo_data import EVAL, RL, SFT, DemoSet, prepare_demo_data
from services.common.config import TrinityConfig, default_config_path, load_config
from services.common.errors import ConfigError
from services.tasks.arith import count_carries, make_problem

MakeConfig = Callable[..., TrinityConfig]


@pytest.fixture
def make_cfg(tmp_path: pathlib.Path) -> MakeConfig:
    """load_config of a YAML text written under tmp_path, with checkpoint_root_dir tmp_path/runs and project proj."""

    def make(text: str, *overrides: str) -> TrinityConfig:
        path = tmp_path / "config.yaml"
        path.write_text(f"checkpoint_root_dir: {tmp_path / 'runs'}\nproject: proj\n" + text)
        return load_config(path, overrides)

    return make


# ---- demo data -----------------------------------------------------------------------------------


def read_rows(path: pathlib.Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The demo's files, generated once for the read-only tests below."""
    path = tmp_path_factory.mktemp("demo")
    assert prepare_demo_data(str(path)) == [str(path / s.file) for s in (EVAL, SFT, RL)]  # eval first
    return path


def test_demo_data_writes_the_three_sets_and_nothing_else(demo_dir: pathlib.Path) -> None:
    assert sorted(p.name for p in demo_dir.iterdir()) == ["eval.jsonl", "rl.jsonl", "sft.jsonl"]  # no .tmp


@pytest.mark.parametrize("demo_set", [EVAL, SFT, RL], ids=lambda s: s.file)
def test_demo_set_is_as_its_spec_says(demo_dir: pathlib.Path, demo_set: DemoSet) -> None:
    spec = demo_set.spec
    rows = read_rows(demo_dir / demo_set.file)
    assert len(rows) == demo_set.n
    assert len({row["question"] for row in rows}) == demo_set.n  # distinct within a set
    for row in rows:
        values = [int(v) for v in row["question"].removesuffix("=").split(spec.op)]
        assert len(values) == spec.operands and all(0 <= v <= spec.top for v in values)
        assert row == make_problem(values, spec)  # the right answer, padded as the spec says
        if spec.op == "+":
            carries = count_carries(values, spec.digits)
            assert carries >= spec.min_carries, row
            assert spec.max_carries is None or carries <= spec.max_carries, row


def test_demo_sets_share_no_question(demo_dir: pathlib.Path) -> None:
    questions = {s.file: {row["question"] for row in read_rows(demo_dir / s.file)} for s in (EVAL, SFT, RL)}
    assert not questions["eval.jsonl"] & questions["sft.jsonl"]
    assert not questions["eval.jsonl"] & questions["rl.jsonl"]
    assert not questions["sft.jsonl"] & questions["rl.jsonl"]


def test_demo_data_is_the_same_on_every_call(demo_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    prepare_demo_data(str(tmp_path))
    for name in ("eval.jsonl", "sft.jsonl", "rl.jsonl"):
        assert (tmp_path / name).read_bytes() == (demo_dir / name).read_bytes()


def test_demo_data_present_is_kept_and_only_a_missing_file_is_rewritten_identically(
    demo_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    for name in ("eval.jsonl", "sft.jsonl"):
        shutil.copy(demo_dir / name, tmp_path / name)
    (tmp_path / "rl.jsonl").write_text("the user's own\n")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert prepare_demo_data(str(tmp_path)) == []
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()} == before

    (tmp_path / "rl.jsonl").unlink()  # rl excludes eval's and sft's questions: still the same file
    assert prepare_demo_data(str(tmp_path)) == [str(tmp_path / "rl.jsonl")]
    assert (tmp_path / "rl.jsonl").read_bytes() == (demo_dir / "rl.jsonl").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.jsonl", "rl.jsonl", "sft.jsonl"]  # no .tmp


# ---- prepare_data --------------------------------------------------------------------------------


@pytest.fixture
def demo_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record prepare_demo_data calls instead of generating (generation is tested above)."""
    calls: list[str] = []

    def recording(data_dir: str) -> list[str]:
        calls.append(data_dir)
        return []

    monkeypatch.setattr(demo_data, "prepare_demo_data", recording)
    yield calls


TASKSET_AT = """\
buffer:
  explorer_input:
    taskset: {{name: tasks, storage_type: file, path: "{path}"}}
"""


def test_missing_demo_data_is_generated(make_cfg: MakeConfig, tmp_path: pathlib.Path) -> None:
    cfg = make_cfg(TASKSET_AT.format(path="${checkpoint_root_dir}/${project}/demo_data/rl.jsonl"))
    prepare.prepare_data(cfg)
    demo = tmp_path / "runs" / "proj" / "demo_data"
    assert sorted(p.name for p in demo.iterdir()) == ["eval.jsonl", "rl.jsonl", "sft.jsonl"]


def test_demo_data_of_a_stages_experience_buffer_is_generated(
    make_cfg: MakeConfig, demo_calls: list[str], tmp_path: pathlib.Path
) -> None:
    cfg = make_cfg(
        "stages:\n"
        "  - stage_name: sft\n"
        "    mode: train\n"
        "    algorithm: {algorithm_type: sft}\n"
        "    buffer:\n"
        "      trainer_input:\n"
        "        experience_buffer: {name: sft_data, storage_type: file,"
        " path: '${checkpoint_root_dir}/${project}/demo_data/sft.jsonl'}\n"
    )
    prepare.prepare_data(cfg)
    assert demo_calls == [str(tmp_path / "runs" / "proj" / "demo_data")]


def test_present_demo_data_is_not_regenerated(
    make_cfg: MakeConfig, demo_calls: list[str], tmp_path: pathlib.Path
) -> None:
    (tmp_path / "runs" / "proj" / "demo_data").mkdir(parents=True)
    (tmp_path / "runs" / "proj" / "demo_data" / "rl.jsonl").write_text(
        ""
    )  # only what the config reads counts
    cfg = make_cfg(TASKSET_AT.format(path="${checkpoint_root_dir}/${project}/demo_data/rl.jsonl"))
    prepare.prepare_data(cfg)
    assert demo_calls == []


@pytest.mark.parametrize(
    "path",
    [
        "/elsewhere/tasks.jsonl",  # the user's file: theirs to provide
        "${checkpoint_root_dir}/${project}/demo_data_mine/rl.jsonl",  # shares the prefix, not the directory
        "${checkpoint_root_dir}/other_project/demo_data/rl.jsonl",
    ],
)
def test_other_missing_paths_are_left_alone(
    make_cfg: MakeConfig, demo_calls: list[str], tmp_path: pathlib.Path, path: str
) -> None:
    prepare.prepare_data(make_cfg(TASKSET_AT.format(path=path)))
    assert demo_calls == []
    assert not (tmp_path / "runs").exists()


def test_a_queue_is_not_a_data_file(make_cfg: MakeConfig, demo_calls: list[str]) -> None:
    cfg = make_cfg(
        "buffer:\n  trainer_input:\n    experience_buffer: {name: exp, storage_type: queue,"
        " path: '${checkpoint_root_dir}/${project}/demo_data/queue.db'}\n"
    )
    prepare.prepare_data(cfg)
    assert demo_calls == []


def test_the_packaged_default_reads_only_demo_files_and_generates_them(
    tmp_path: pathlib.Path, demo_calls: list[str]
) -> None:
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}"])
    prepare.prepare_data(cfg)
    demo = tmp_path / cfg.project / "demo_data"
    assert demo_calls == [str(demo)]
    files = {
        s.path
        for stage in cfg.stage_configs
        for s in (
            stage.buffer.explorer_input.taskset,
            *stage.buffer.explorer_input.eval_tasksets,
            stage.buffer.trainer_input.experience_buffer,
        )
        if s is not None and s.storage_type == "file"
    }
    assert files, "the default reads data files"
    assert files <= {str(demo / s.file) for s in (EVAL, SFT, RL)}  # all of them generated by the demo


# ---- preflight -----------------------------------------------------------------------------------


def test_the_packaged_default_passes_preflight(tmp_path: pathlib.Path) -> None:
    prepare.preflight(load_config(None, [f"checkpoint_root_dir={tmp_path}"]))


def test_preflight_names_the_stage_whose_algorithm_rejects_its_args(make_cfg: MakeConfig) -> None:
    # Set globally, the GRPO threshold is inherited by the SFT stage, whose advantage fn takes no args.
    cfg = make_cfg(
        "algorithm:\n  algorithm_type: grpo\n  advantage_fn_args: {std_threshold: 0.0}\n"
        "stages:\n"
        "  - stage_name: warmup\n    mode: train\n    algorithm: {algorithm_type: sft}\n"
        "  - stage_name: rl\n"
    )
    with pytest.raises(ConfigError) as caught:
        prepare.preflight(cfg)
    message = str(caught.value)
    assert message.startswith("stages[0] (warmup): ")
    assert "std_threshold" in message
    assert caught.value.field == "stages[0].algorithm.advantage_fn_args"


def test_preflight_checks_later_stages_too(make_cfg: MakeConfig) -> None:
    cfg = make_cfg(
        "stages:\n"
        "  - stage_name: a\n    algorithm: {algorithm_type: grpo}\n"
        "  - stage_name: b\n    algorithm: {algorithm_type: grpo, advantage_fn_args: {no_such_arg: 1}}\n"
    )
    with pytest.raises(ConfigError, match=r"^stages\[1\] \(b\): .*no_such_arg"):
        prepare.preflight(cfg)


def test_preflight_without_stages_has_no_stage_prefix(make_cfg: MakeConfig) -> None:
    cfg = make_cfg("algorithm:\n  algorithm_type: sft\n  advantage_fn_args: {std_threshold: 0.0}\n")
    with pytest.raises(ConfigError) as caught:
        prepare.preflight(cfg)
    assert "stages[" not in str(caught.value) and "std_threshold" in str(caught.value)


def test_preflight_skips_stages_that_do_not_train(make_cfg: MakeConfig) -> None:
    # An explore-only (or bench) stage builds no algorithm, so its algorithm args are not checked.
    cfg = make_cfg(
        "algorithm:\n  algorithm_type: sft\n  advantage_fn_args: {std_threshold: 0.0}\n"
        "buffer:\n  explorer_input:\n    eval_tasksets: [{name: e, path: e.jsonl}]\n"
        "stages:\n  - stage_name: look\n    mode: explore\n  - stage_name: score\n    mode: bench\n"
    )
    prepare.preflight(cfg)


def test_preflight_rejects_a_bench_with_nothing_to_score(make_cfg: MakeConfig) -> None:
    cfg = make_cfg(
        "stages:\n  - stage_name: train\n    mode: train\n  - stage_name: score\n    mode: bench\n"
    )
    with pytest.raises(ConfigError) as info:
        prepare.preflight(cfg)
    assert info.value.field == "stages[1].buffer.explorer_input.eval_tasksets"
    assert "stages[1] (score)" in str(info.value)


def test_a_run_without_stages_is_named_by_its_mode_unless_both(make_cfg: MakeConfig) -> None:
    from services.cli import stages as st

    assert st.run_label(make_cfg("name: exp\n")) == "exp"
    assert st.run_label(make_cfg("name: exp\nmode: bench\n")) == "exp:bench"
    assert st.run_label(make_cfg("name: exp\nmode: train\n")) == "exp:train"


def test_preflight_passes_valid_stages(make_cfg: MakeConfig) -> None:
    cfg = make_cfg(
        "algorithm:\n  algorithm_type: grpo\n"
        "stages:\n"
        "  - stage_name: sft\n    mode: train\n    algorithm: {algorithm_type: sft}\n"
        "  - stage_name: grpo\n    algorithm: {advantage_fn_args: {std_threshold: 0.0}}\n"
    )
    prepare.preflight(cfg)


# ---- ports and the resolved config ---------------------------------------------------------------


def test_resolve_ports_gives_port_zero_endpoints_a_free_port(
    make_cfg: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([6001, 6002])
    monkeypatch.setattr(prepare, "free_port", lambda: next(ports))
    cfg = make_cfg(
        "services:\n  buffer: {port: 0}\n  synchronizer: {port: 7000}\n  trainer: {port: 0}\n  explorer: {port: 7001}\n"
    )
    resolved = prepare.resolve_ports(cfg)
    assert [
        resolved.services.endpoint(n).port for n in ("buffer", "synchronizer", "trainer", "explorer")
    ] == [
        6001,
        7000,
        6002,
        7001,
    ]
    assert resolved.services.buffer.address.endswith(":6001")
    assert cfg.services.buffer.port == 0 and cfg.services.trainer.port == 0  # the input is not modified


def test_resolve_ports_gives_metrics_port_zero_a_free_port_and_leaves_null_alone(
    make_cfg: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([6001, 6002])
    monkeypatch.setattr(prepare, "free_port", lambda: next(ports))
    cfg = make_cfg(
        "services:\n  buffer: {port: 7000, metrics_port: 0}\n  synchronizer: {port: 0, metrics_port: 9000}\n"
        "  trainer: {port: 7001}\n  explorer: {port: 7002}\n"
    )
    resolved = prepare.resolve_ports(cfg)
    assert (resolved.services.buffer.port, resolved.services.buffer.metrics_port) == (7000, 6001)
    assert (resolved.services.synchronizer.port, resolved.services.synchronizer.metrics_port) == (6002, 9000)
    assert resolved.services.trainer.metrics_port is None and resolved.services.explorer.metrics_port is None


def test_resolve_ports_with_fixed_ports_changes_nothing(
    make_cfg: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_port() -> int:
        raise AssertionError("no endpoint has port 0")

    monkeypatch.setattr(prepare, "free_port", no_port)
    cfg = make_cfg("")
    assert prepare.resolve_ports(cfg) is cfg


def test_resolved_config_reloads_as_the_same_stage_without_stages(
    make_cfg: MakeConfig, tmp_path: pathlib.Path
) -> None:
    cfg = make_cfg("stages:\n  - stage_name: sft\n    mode: train\n    algorithm: {algorithm_type: sft}\n")
    stage = cfg.stage_configs[0]
    path = tmp_path / "out" / "config.resolved.yaml"
    prepare.write_resolved_config(stage, str(path))
    assert "stages" not in yaml.safe_load(path.read_text())
    reloaded = load_config(path)
    assert reloaded.model_dump() == stage.model_dump()
    assert reloaded.run_dir == stage.run_dir


def test_default_config_path_is_the_packaged_file() -> None:
    assert (
        pathlib.Path(default_config_path())
        == pathlib.Path(run.__file__).parent.parent / "common" / "config" / "default.yaml"
    )


def test_a_fresh_run_gets_a_timestamped_name_and_its_children_resume_within_it(
    make_cfg: MakeConfig, tmp_path: pathlib.Path
) -> None:
    cfg = make_cfg("name: exp\ncontinue_from_checkpoint: false\n")
    fresh = load_config(tmp_path / "config.yaml", prepare.fresh_run_overrides(cfg, []))
    assert fresh.name.startswith("exp_") and fresh.name != "exp"
    assert fresh.run_dir != cfg.run_dir
    # What a restarted child reads: it resumes this fresh run's checkpoints instead of the base model.
    path = tmp_path / "out" / "config.resolved.yaml"
    prepare.write_resolved_config(fresh.stage_configs[0], str(path))
    child = load_config(path)
    assert child.continue_from_checkpoint is True
    assert child.run_dir == fresh.run_dir
