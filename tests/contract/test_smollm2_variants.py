"""examples/smollm2_grpo's variants are config.yaml with a few keys changed (so a measured difference
is the variant's), and each loads with the meaning its header claims."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from services.common.config import load_config

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "smollm2_grpo"

# config.yaml's lean memory settings came after the variants were measured: they keep the earlier ones
EARLIER = {"explorer.rollout_model.kv_cache_memory_gib", "trainer.micro_batch_size"}
# DAPO on the first wording
DAPO = {
    "name",
    *EARLIER,
    "algorithm.algorithm_type",
    "algorithm.policy_loss_fn_args.clip_range_low",
    "algorithm.policy_loss_fn_args.clip_range_high",
    "algorithm.policy_loss_fn_args.loss_agg_mode",
    "buffer.explorer_input.taskset.path",
    "buffer.explorer_input.taskset.reward_fn_args.boxed_wrong",
    "buffer.explorer_input.eval_tasksets",
    "data_processor.experience_pipeline.operators",
    "explorer.max_num_gen_batches",
}
# fully asynchronous: no sync wait, rows at most 2 versions old, rollout correction
ASYNC = {
    "algorithm.rollout_correction.rollout_is",
    "algorithm.rollout_correction.rollout_is_threshold",
    "algorithm.rollout_correction.rollout_rs",
    "algorithm.rollout_correction.rollout_rs_threshold",
    "synchronizer.sync_offset",
    "synchronizer.sync_style",
    "synchronizer.explorer_sync_interval",
    "synchronizer.max_staleness",
}
# the keys each variant changes from config.yaml (flattened paths)
CHANGED = {
    "offset1": {"name", "synchronizer.sync_offset", *EARLIER},
    "colocate": {"name", "mode", "synchronizer.sync_method", *EARLIER},
    # the transformers engine whatever TRINITY_ENGINE says (it computes on the shared weights)
    "colocate_small": {
        "name",
        "mode",
        "synchronizer.sync_method",
        "explorer.rollout_model.engine_type",
        "trainer.micro_batch_size",
    },
    "fully_async": {"name", *EARLIER} | ASYNC,
    "dapo_first_wording": DAPO,
    # dapo_first_wording run as fully_async runs GRPO
    "dapo_fully_async": DAPO | ASYNC,
    # dapo_first_wording run as offset1 runs GRPO
    "dapo_offset1": DAPO | {"synchronizer.sync_offset"},
}


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def test_every_variant_is_listed() -> None:
    assert {p.stem for p in EXAMPLE.glob("*.yaml")} - {"config"} == set(CHANGED)


@pytest.mark.parametrize("variant", sorted(CHANGED))
def test_a_variant_changes_only_its_keys(variant: str) -> None:
    base = flat(yaml.safe_load((EXAMPLE / "config.yaml").read_text()))
    other = flat(yaml.safe_load((EXAMPLE / f"{variant}.yaml").read_text()))
    changed = {key for key in base.keys() | other.keys() if base.get(key) != other.get(key)}
    assert changed == CHANGED[variant]


def test_the_variants_mean_what_they_say(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))
    for data in ("smollm2_data", "smollm2_data_first"):
        (tmp_path / data).mkdir()
        for split in ("train", "heldout"):
            (tmp_path / data / f"{split}.jsonl").write_text('{"question": "q", "answer": "1"}\n')
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("SMOLLM2_DIR", str(model))
    fully = load_config(str(EXAMPLE / "fully_async.yaml"))
    assert fully.synchronizer.sync_style == "fully_async" and fully.synchronizer.max_staleness == 2
    assert fully.algorithm.rollout_correction is not None and fully.algorithm.bypass_old_logprobs
    assert fully.algorithm.rollout_correction.rollout_rs == "token_k1"
    dapo = load_config(str(EXAMPLE / "dapo_first_wording.yaml"))
    assert dapo.algorithm.algorithm_type == "dapo" and dapo.algorithm.repeat_times == 8
    assert [op.name for op in dapo.data_processor.experience_pipeline.operators] == [
        "mask_response_truncated",
        "dapo_dynamic_sampling",
    ]
    assert dapo.data_processor.experience_pipeline.operators[1].args == {"criterion": "std"}
    assert dapo.buffer.explorer_input.taskset.reward_fn_args == {"boxed_wrong": 0.3}
    dapo_async = load_config(str(EXAMPLE / "dapo_fully_async.yaml"))
    assert dapo_async.algorithm.algorithm_type == "dapo"
    assert dapo_async.synchronizer.sync_style == "fully_async" and dapo_async.synchronizer.max_staleness == 2
    assert dapo_async.algorithm.rollout_correction is not None
    assert load_config(str(EXAMPLE / "offset1.yaml")).synchronizer.sync_offset == 1
    dapo_offset1 = load_config(str(EXAMPLE / "dapo_offset1.yaml"))
    assert dapo_offset1.algorithm.algorithm_type == "dapo" and dapo_offset1.synchronizer.sync_offset == 1
    colocate = load_config(str(EXAMPLE / "colocate.yaml"))
    assert colocate.mode == "colocate" and colocate.synchronizer.in_place
    small = load_config(str(EXAMPLE / "colocate_small.yaml"))
    assert small.mode == "colocate" and small.explorer.rollout_model.engine_type == "transformers"
    assert small.trainer.micro_batch_size == 4
