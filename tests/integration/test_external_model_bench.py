"""`trinity run` in mode bench on a remote OpenAI-compatible API (model.external_model): the explorer's
OpenAI API serves the builtin tiny model on loopback here, the bench explorer (a real subprocess that
loads no model) scores the eval taskset through it, and the scores in eval/results.jsonl equal those of
the same model benched locally (greedy sampling: the same answers)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from services.common.config import validate_config
from services.explorer.build import build_pool, build_runner
from services.explorer.openai_server import OpenAIServer
from services.explorer.runner import VersionRef
from services.models.loading import load_tokenizer
from services.tasks.arith import ArithSpec, generate, write_jsonl
from tests.integration.runs import PORTS, trinity_run, write_run_config

pytestmark = pytest.mark.slow
MODEL = {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 8, "max_response_tokens": 4}
KEY = "eval/eval/accuracy/mean@1"


def _config(tmp_path: pathlib.Path, name: str, model: dict[str, Any]) -> pathlib.Path:
    data = tmp_path / "tasks.jsonl"
    write_jsonl(generate(ArithSpec(digits=2), 16, seed=5), data)
    eval_set = {
        "name": "eval",
        "path": str(data),
        "format": {"prompt_key": "question", "response_key": "answer"},
        "default_workflow_type": "arith_workflow",
        "rollout_args": {"temperature": 0.0, "max_tokens": 4},
    }
    cfg = {
        "mode": "bench",
        "project": "ext",
        "name": name,
        "checkpoint_root_dir": str(tmp_path / "runs"),
        "model": model,
        "buffer": {"batch_size": 4, "explorer_input": {"eval_tasksets": [eval_set]}},
        "monitor": {"monitor_type": "none"},
        "services": {**PORTS, "shutdown_grace_s": 3},
    }
    return write_run_config(cfg, tmp_path / f"{name}.yaml")


def _scores(tmp_path: pathlib.Path, name: str) -> dict[str, float]:
    lines = (tmp_path / "runs" / "ext" / name / "eval" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["mode"] == "bench" and record["model_version"] == 0
    return dict(record["scores"])


@pytest.mark.timeout(600)
def test_bench_scores_a_remote_openai_api(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = validate_config({"model": MODEL})
    tokenizer = load_tokenizer(cfg.model.model_path)
    wrapper = build_runner(cfg, build_pool(cfg, tokenizer), tokenizer, VersionRef(0), [])._all[0].wrapper
    server = OpenAIServer(wrapper, port=0, api_key="sk-bench")
    server.start()
    try:
        monkeypatch.setenv("BENCH_API_URL", server.base_url)
        monkeypatch.setenv("BENCH_API_KEY", "sk-bench")
        external = {
            "enable": True,
            "model_name": "tiny",
            "base_url_env": "BENCH_API_URL",
            "api_key_env": "BENCH_API_KEY",
        }
        remote_model = {"model_path": "tiny-remote", "max_response_tokens": 4, "external_model": external}
        out = trinity_run(_config(tmp_path, "remote", remote_model))
        assert "eval of model version 0" in out
    finally:
        server.stop()
    remote = _scores(tmp_path, "remote")
    assert remote["eval/eval/tasks"] == 16.0 and 0.0 <= remote[KEY] <= 1.0
    trinity_run(_config(tmp_path, "local", MODEL))
    local = _scores(tmp_path, "local")
    assert {k: v for k, v in remote.items() if k.startswith("eval/eval/")} == {
        k: v for k, v in local.items() if k.startswith("eval/eval/")
    }
