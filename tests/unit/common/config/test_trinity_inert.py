"""Trinity v0.5.2 keys with no effect here (`no effect` in services/common/config/trinity_keys.py):
at a value that changes nothing here the key is accepted (and dropped before validation); any other
value is refused naming the key and why. Also the whole-schema inventory: every user-facing key of
Trinity v0.5.2 (tests/data/trinity_v052_keys.txt) has a meaning here."""

from __future__ import annotations

from typing import Any

import pytest

from scripts.trinity_compat_doc import schema_gap
from services.common.config import validate_config
from services.common.config.trinity_keys import ANY, TRINITY_KEYS
from services.common.errors import ConfigError

INERT = sorted(key for key, entry in TRINITY_KEYS.items() if entry.status == "no effect")
# a concrete place for the patterns' wildcards, and what an item there needs to be valid
CONCRETE = {"buffer.*": "buffer.explorer_input.taskset"}


def _tree(path: str, value: Any) -> dict[str, Any]:
    for pattern, concrete in CONCRETE.items():
        if path.startswith(pattern + "."):
            path = concrete + path[len(pattern) :]
    parts = path.split(".")
    node: Any = value
    for part in reversed(parts):
        if part.endswith("[*]"):
            item = node if isinstance(node, dict) else {}
            node = {part[:-3]: [{"model_path": "builtin:tiny-arith", **item}]}
        else:
            node = {part: node}
    return node


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _config(path: str, value: Any) -> dict[str, Any]:
    base = {"buffer": {"explorer_input": {"taskset": {"name": "t", "path": "t.jsonl"}}}}
    return _merge(base, _tree(path, value))


def test_there_are_inert_keys_to_check() -> None:
    assert len(INERT) >= 40


@pytest.mark.parametrize("key", INERT)
def test_an_inert_value_loads_and_another_is_refused_naming_the_key(key: str) -> None:
    entry = TRINITY_KEYS[key]
    accepted = "some label" if entry.accepts is ANY else entry.accepts[0]
    validate_config(_config(key, accepted))
    if entry.accepts is ANY:
        return
    refused: Any = {"x": 1} if isinstance(entry.accepts[0], dict) else "something else"
    with pytest.raises(ConfigError) as info:
        validate_config(_config(key, refused))
    where = key
    for pattern, concrete in CONCRETE.items():
        where = where.replace(pattern + ".", concrete + ".")
    assert str(info.value) == f"{where.replace('[*]', '[0]')} {refused!r}: {entry.meaning}"


def test_every_trinity_key_has_a_meaning_here() -> None:
    gap, total = schema_gap()
    assert total > 500, "tests/data/trinity_v052_keys.txt is Trinity v0.5.2's whole schema"
    assert not gap, f"Trinity keys with no meaning here (schema or trinity_keys.py): {gap}"


def test_group_is_a_directory_level_of_the_run() -> None:
    assert validate_config({}).run_dir.endswith("trinity-grpc/default")
    assert validate_config({"group": "sweep1"}).run_dir.endswith("trinity-grpc/sweep1/default")


def test_chat_template_path_is_read_into_custom_chat_template(tmp_path) -> None:  # type: ignore[no-untyped-def]
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    cfg = validate_config({"model": {"chat_template_path": str(template)}})
    assert cfg.model.custom_chat_template == template.read_text()
    with pytest.raises(ConfigError, match="chat_template_path '/nowhere.jinja': cannot read it"):
        validate_config({"model": {"chat_template_path": "/nowhere.jinja"}})


def test_a_stage_cannot_have_its_own_data_processor() -> None:
    stage = {"stage_name": "s1", "data_processor": {"experience_pipeline": {"operators": []}}}
    with pytest.raises(ConfigError, match="a per-stage data_processor is not supported"):
        validate_config({"stages": [stage]})


def test_no_inert_entry_shadows_a_key_of_the_schema() -> None:
    # the loader drops `no effect` keys before validation: one that is also ours would be lost
    from scripts.trinity_compat_doc import our_key_paths

    ours, _leaves = our_key_paths()
    concrete = {key.replace("buffer.*.", "buffer.explorer_input.taskset.") for key in INERT}
    assert not concrete & ours, sorted(concrete & ours)
