"""`trinity config check` reports every problem of a config in one run: the Trinity keys refused by
their entry, the schema's errors (fields, then the section and cross-section checks they would have
hidden), the loader's conflicts, a stage's own problems and the checks that need a loaded config
(ports, files, registries, priority fns); and what it accepts it checks (priority_fn, concurrent_mode,
model.tinker's keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.config_check import check_file
from services.cli.main import main
from services.common.config import validate_config
from services.common.errors import ConfigError

# One problem of each stage of checking, each of which used to hide the ones after it.
PROBLEMS_BY_STAGE = """
checkpoint_root_dir: {root}/runs
algorithm: {{algorithm_type: grpo, repeat_times: 4, optimizer: {{grad_clip: 2.0}}}}
model:
  tinker: {{enable: true}}
  max_prompt_tokens: nope
cluster: {{ray_address: "10.0.0.1:6379"}}
explorer:
  concurrent_mode: made_up
trainer: {{grad_clip: 0.5, param_offload: true}}
services: {{buffer: {{port: 6000}}, trainer: {{port: 6000}}}}
buffer:
  explorer_input:
    taskset: {{name: t, path: {root}/nowhere.jsonl, repeat_times: 8, default_workflow_type: no_such_workflow}}
  trainer_input:
    experience_buffer:
      name: exp
      storage_type: queue
      replay_buffer: {{enable: true, priority_fn: some.module.that.is.not.there}}
stages:
  - stage_name: s1
    trainer: {{no_such_key: 1}}
"""


def test_every_problem_of_every_stage_in_one_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(PROBLEMS_BY_STAGE.format(root=tmp_path))
    cfg, report = check_file(str(path), [])
    assert cfg is None
    starts = [
        # Trinity keys refused by their entry (strip_inert)
        "cluster.ray_address '10.0.0.1:6379': there is no Ray here",
        "explorer.concurrent_mode 'made_up': how a runner runs",
        "trainer.param_offload True: false only: CPU offload",
        # the schema: a field, then a section's check, then the cross-section ones
        "model.max_prompt_tokens: Input should be a valid integer",
        "model.tinker.enable: true is not supported",
        "trainer.grad_clip (0.5) and algorithm.optimizer.grad_clip (2.0) are the same setting",
        # the loader's conflict
        "buffer.explorer_input.taskset.repeat_times (8) differs from algorithm.repeat_times (4)",
        # a stage's own key
        "stages[0].trainer.no_such_key: unknown key",
        # the checks on the loaded config (on what is left once the keys above are taken out)
        "services.trainer.port: port 6000 is also services.buffer.port",
        f"stages[0].buffer.explorer_input.taskset.path: {tmp_path}/nowhere.jsonl does not exist",
        "stages[0].buffer.explorer_input.taskset.default_workflow_type: unknown workflow 'no_such_workflow'",
        "stages[0].buffer.trainer_input.experience_buffer.replay_buffer.priority_fn: cannot import priority_fn",
    ]
    for start in starts:
        assert sum(p.startswith(start) for p in report.problems) == 1, (start, report.problems)
    assert len(report.problems) == len(starts), report.problems
    # trinity run refuses the same config naming all of them at once
    with pytest.raises(ConfigError) as info:
        validate_config(_raw(path))
    assert len(str(info.value).splitlines()) == 8  # the eight that loading finds
    with pytest.raises(SystemExit) as exit_code:
        main(["config", "check", str(path)])
    assert exit_code.value.code == 2 and len(capsys.readouterr().err.splitlines()) == 1 + len(starts)


def _raw(path: Path) -> dict[str, object]:
    from services.common.config import load_raw

    return load_raw(str(path))


def test_a_made_up_priority_fn_is_refused_and_its_arguments_checked(tmp_path: Path) -> None:
    from services.buffer.kinds.priority import PRIORITY_FNS
    from services.common.config.buffer import PRIORITY_FN_NAMES

    assert sorted(PRIORITY_FNS) == list(PRIORITY_FN_NAMES)  # the config's list is the buffer's registry
    queue = {"name": "q", "storage_type": "queue"}
    with pytest.raises(
        ConfigError, match="unknown priority_fn 'made_up'; use one of decay_limit_randomization"
    ):
        validate_config(
            {"buffer": {"trainer_input": {"experience_buffer": {**queue, "priority_fn": "made_up"}}}}
        )
    replay = {
        "enable": True,
        "priority_fn": "decay_limit_randomization",
        "priority_fn_args": {"sigma": 1, "bogus": 2},
    }
    path = tmp_path / "c.yaml"
    path.write_text(
        f"checkpoint_root_dir: {tmp_path}\nmode: train\nbuffer: {{trainer_input: {{experience_buffer: "
        f"{{name: q, storage_type: queue, replay_buffer: {replay}}}}}}}\n"
    )
    _cfg, report = check_file(str(path), [])
    assert any(
        p.startswith(
            "buffer.trainer_input.experience_buffer.replay_buffer.priority_fn_args: bad priority_fn_args"
        )
        for p in report.problems
    ), report.problems


@pytest.mark.parametrize("mode", ["sequential", "asynchronous", "multi-threading"])
def test_trinitys_concurrent_modes_are_accepted(mode: str) -> None:
    validate_config({"explorer": {"concurrent_mode": mode}})


def test_trinitys_pde_discovery_config_finds_the_workflow_and_its_hint_updater(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pde_discovery_cod_600steps_hard.yaml names the workflow by Trinity's dotted path and the hints'
    updater pde_update_context: both run here; what is left is what this machine lacks (wandb, 3 nodes,
    the data, Trinity's family file)."""
    monkeypatch.setenv("TRINITY_MODEL_PATH", "builtin:tiny-arith")
    path = "tests/data/trinity-v0.6-examples/research_cod/exp_plan_final/train/pde_discovery_cod_600steps_hard.yaml"
    _cfg, report = check_file(path, [])
    text = "\n".join(report.problems)
    assert "cannot import workflow" not in text and "update_context_impl" not in text
    assert [p.split(" ")[0].split(":")[0] for p in report.problems] == [
        "monitor.monitor_type",
        "cluster.node_num",
        "buffer.explorer_input.tasksets[0].path",
        "buffer.explorer_input.tasksets[0].default_workflow_type",
    ]
    assert "ground_truth_family: 'physical_full_train.json' does not exist here" in report.problems[-1]
