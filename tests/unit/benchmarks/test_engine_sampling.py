"""benchmarks/engine_sampling.py: the baseline's token count, and one tiny run of the script."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import torch

from benchmarks import engine_sampling

REPO = pathlib.Path(__file__).resolve().parents[3]


class ScriptedGenerate(torch.nn.Module):
    """`generate` returns fixed rows: prompt [7, 7] then the scripted continuation (EOS 2, pad 0)."""

    def generate(self, input_ids, **_kwargs):
        tails = torch.tensor([[5, 6, 2, 0], [5, 5, 5, 5], [2, 0, 0, 0]])
        return torch.cat([input_ids.repeat(3, 1), tails], dim=1)


def test_the_baseline_counts_tokens_up_to_and_with_the_first_eos():
    params = SimpleNamespace(temperature=0.7, n=3, max_tokens=4)
    # 3 (5, 6, EOS) + 4 (no EOS) + 1 (EOS at once); the padding after an EOS is not counted
    assert engine_sampling.baseline(ScriptedGenerate(), [[7, 7]], params, eos=2, pad=0) == 8


def test_a_quick_run_prints_the_json_line(tmp_path: pathlib.Path):
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "engine_sampling.py"),
            "--quick",
            "--model",
            "builtin:tiny-30m",
            "--prompts",
            "2",
            "--n",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["name"] == "engine_sampling" and result["ours"] > 0 and result["baseline"] > 0
    assert result["ratio"] > 0 and result["config"]["n"] == 2
