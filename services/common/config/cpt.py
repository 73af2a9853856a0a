"""What `algorithm_type: cpt` needs, checked once when the config loads.

Trinity v0.6 registers `cpt` (trinity.algorithm.algorithm.CPTAlgorithm); the class itself is not in
any copy of Trinity's sources we could read, so this follows the plain reading of the name,
continued pre-training, with the rules of Trinity's SFT (its check_config): the trainer reads a
dataset file (`buffer.trainer_input.experience_buffer.path` required in mode train), modes that
explore are refused, and weights reach the outside only as checkpoints. The rows are plain text
(`format.text_key`), trained on whole with sft's loss (services/trainer/dataset_rows.py).
"""

from __future__ import annotations

from typing import Any

KEY = "algorithm.algorithm_type"
EXPLORING = ("both", "explore", "colocate", "serve")


def cpt_problems(cfg: Any) -> list[str]:
    """Every setting a cpt run cannot work with, one line each starting with the key it blames
    (algorithm.algorithm_type, so that `trinity config check` goes on without it); [] when it can."""
    if cfg.algorithm.algorithm_type != "cpt":
        return []
    problems = []
    if cfg.mode in EXPLORING:
        problems.append(
            f"{KEY} cpt with mode {cfg.mode}: continued pre-training trains on a text dataset, not on "
            "rollouts (Trinity refuses its SFT in modes that explore too); use mode train (bench scores "
            "its checkpoints)"
        )
    buffer = cfg.buffer.trainer_input.experience_buffer
    where = "buffer.trainer_input.experience_buffer"
    if cfg.mode == "train" and (buffer.storage_type != "file" or not buffer.path):
        problems.append(
            f"{KEY} cpt needs {where}.storage_type file and {where}.path (a jsonl/parquet file or HF "
            f"directory of text rows), got storage_type {buffer.storage_type!r} and path {buffer.path!r}"
        )
    if buffer.format.prompt_type == "messages":
        problems.append(
            f"{KEY} cpt reads plain text rows ({where}.format.text_key {buffer.format.text_key!r}), not "
            f"chat messages: remove {where}.format.prompt_type messages (sft trains on conversations)"
        )
    if buffer.schema_type is not None:
        problems.append(
            f"{KEY} cpt with {where}.schema_type {buffer.schema_type!r}: cpt rows are text rows "
            f"({where}.format.text_key); remove schema_type"
        )
    return problems
