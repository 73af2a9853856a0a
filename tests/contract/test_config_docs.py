"""docs/config.md is generated from the config models; it must match them and cover every key."""

from __future__ import annotations

import pathlib
from typing import Any, Literal

from pydantic import BaseModel, Field

from scripts.gen_config_docs import DOC_PATH, collect_sections, main, models_in, render, render_section
from services.common.config.base import Section
from services.common.config.schema import TrinityConfig


def test_config_docs_are_fresh() -> None:
    expected = render()
    current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
    assert current == expected, "docs/config.md is stale: run python scripts/gen_config_docs.py"


def _leaf_paths(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str | None]]:
    """(key path, docstring) of every field of the schema, through nested sections, lists and maps."""
    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append((path, info.description))
        for child, suffix in models_in(info.annotation):
            out += _leaf_paths(child, f"{path}{suffix}.")
    return out


def test_every_key_has_a_docstring_and_a_row() -> None:
    """A field without a docstring would render as an empty cell; every key of the first path of its model is a row."""
    missing = [path for path, doc in _leaf_paths(TrinityConfig) if not (doc and doc.strip())]
    assert not missing, f"config fields without a docstring (add one under the field): {missing}"
    page = render()
    for doc in collect_sections(TrinityConfig):
        prefix = f"{doc.path}." if doc.path else ""
        for name in doc.model.model_fields:
            assert f"| `{prefix}{name}` |" in page


class _Leaf(Section):
    mode: Literal["a", "b"] | None = None
    """Pick `a|b` or <none>; see `<run dir>`."""
    size: int = Field(4, ge=1, le=8)
    """Size in MiB."""


class _Node(Section):
    """A node."""

    leaf: _Leaf = _Leaf(size=2)
    """The leaf."""
    leaves: list[_Leaf] = Field(default_factory=list)
    """More leaves."""
    named: dict[str, _Leaf] = Field(default_factory=dict)
    """Leaves by name."""
    need: str
    """Must be given."""
    extra: dict[str, Any] | None = None
    """Free-form."""


def test_generator_is_generic_over_nesting_reuse_bounds_and_escaping() -> None:
    sections = collect_sections(_Node)
    assert [(s.path, s.model) for s in sections] == [("", _Node), ("leaf", _Leaf)]
    assert sections[1].also_at == ["leaves[]", "named.<name>"]
    links = {s.model: s.anchor for s in sections}
    root = "\n".join(render_section(sections[0], links))
    leaf = "\n".join(render_section(sections[1], links))
    assert "| `leaf` | [_Leaf](#key-leaf) | `{size: 2}` |  | The leaf. |" in root
    assert "| `leaves` | list of [_Leaf](#key-leaf) | `[]` |" in root
    assert "| `named` | map of str → [_Leaf](#key-leaf) | `{}` |" in root
    assert "| `need` | str | *required* |" in root
    assert "| `extra` | map of str → any or null | `null` |" in root
    assert "A node." in root
    # pipes are escaped even inside code spans (GFM tables split on them); < is escaped outside code only
    assert (
        "| `leaf.mode` | str or null | `null` | `a`, `b` | Pick `a\\|b` or &lt;none>; see `<run dir>`. |"
        in leaf
    )
    assert "| `leaf.size` | int | `4` | ≥ 1; ≤ 8 | Size in MiB. |" in leaf
    assert "used under `leaves[]`, `named.<name>`" in leaf


def test_check_flag_reports_stale_and_fresh(tmp_path: pathlib.Path, capsys: Any) -> None:
    out = tmp_path / "config.md"
    out.write_text("old\n")
    assert main(["--check", "--out", str(out)]) == 1
    assert "run python scripts/gen_config_docs.py" in capsys.readouterr().err
    assert main(["--out", str(out)]) == 0
    assert main(["--check", "--out", str(out)]) == 0
    assert out.read_text() == render()
