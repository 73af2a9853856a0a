"""Nothing is accepted and ignored: every key of the schema is read by some code under services/.

"Read" is found textually: the key's name appears as an attribute (`.name`) or a string (`"name"`)
somewhere in services/ other than its own declaration line. Names shared by several sections (like
`name` or `path`) pass as soon as one of them is read, so this catches the clear cases (a key no
code mentions), not every one.

Two lists are allowed to be unread, each entry with its reason:
- NO_EFFECT: keys whose value cannot matter here (documented as such in their docstrings).
- KNOWN_GAPS: keys that are accepted and not yet read: a defect being tracked. The test fails when
  one of them becomes read (remove it from the list) and when a new unread key appears.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from pydantic import BaseModel

from scripts.gen_config_docs import models_in
from services.common.config.schema import TrinityConfig
from tests.conftest import REPO

SERVICES = REPO / "services"

NO_EFFECT = {
    "ray_namespace": "there is no Ray: a namespace name cannot change anything",
    "enable_progress_bar": "progress is logged, never drawn: a bar on or off changes no result",
    "save_strategy": "Trinity's checkpoint-saving concurrency; the trainer here saves in one thread",
    "group_by_node": "one node per run: grouping logs by node changes nothing",
    "num_process": "Data-Juicer's worker count; task operators are rejected, experience operators run in-process",
    "target_fields": "the task pipeline's fields; task operators are rejected",
    **{
        key: "model.tinker's LoRA / TuFT settings, read only with tinker.enable, which is refused"
        for key in (
            "train_mlp",
            "train_attn",
            "train_unembed",
            "server_loss_fn",
            "forward_backward_chunk_bytes",
        )
    },
}
KNOWN_GAPS: dict[str, str] = {}


def _keys(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str]]:
    for name, info in model.model_fields.items():
        yield prefix + name, name
        for child, suffix in models_in(info.annotation):
            yield from _keys(child, f"{prefix}{name}{suffix}.")


def _unread_names() -> set[str]:
    source = "\n".join(path.read_text() for path in SERVICES.rglob("*.py"))
    without_declarations = re.sub(r"(?m)^[ \t]+\w+: .*$", "", source)
    return {
        name
        for _path, name in _keys(TrinityConfig)
        if not re.search(rf"\.{name}\b|[\"']{name}[\"']", without_declarations)
    }


def test_every_key_is_read_by_some_code() -> None:
    unread = _unread_names()
    new = sorted(unread - set(NO_EFFECT) - set(KNOWN_GAPS))
    assert not new, f"config keys no code reads (give them a meaning, or reject them): {new}"
    fixed = sorted(set(KNOWN_GAPS) - unread)
    assert not fixed, f"now read, remove from KNOWN_GAPS: {fixed}"


def test_the_walk_sees_nested_sections() -> None:
    paths = {path for path, _name in _keys(TrinityConfig)}
    assert "buffer.trainer_input.experience_buffer.replay_buffer.enable" in paths
    assert "buffer.trainer_input.auxiliary_buffers.<name>.format.chosen_key" in paths
    assert "explorer.auxiliary_models[].model_path" in paths
