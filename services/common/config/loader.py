"""YAML → OmegaConf (interpolation, `${oc.env:VAR,default}`) → pydantic, with errors that name the key."""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import resources
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from services.common.config.messages import format_error
from services.common.config.schema import TrinityConfig
from services.common.errors import ConfigError

__all__ = ["default_config_path", "format_error", "load_config", "load_raw", "merge_stage", "validate_config"]

DEFAULT_CONFIG_NAME = "default.yaml"


def default_config_path() -> str:
    """The embedded default config shipped inside the package."""
    return str(resources.files("services.common.config") / DEFAULT_CONFIG_NAME)


def load_config(path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()) -> TrinityConfig:
    """Load, interpolate and validate a config file; `overrides` are dotlist items (`a.b=1`)."""
    raw = load_raw(path, overrides)
    return validate_config(raw)


def load_raw(path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    path = path or default_config_path()
    if not os.path.exists(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        conf = OmegaConf.load(os.fspath(path))
        merged = OmegaConf.merge(conf, OmegaConf.from_dotlist(list(overrides))) if overrides else conf
        data = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        raise ConfigError(
            f"cannot read {path}: {exc.msg if hasattr(exc, 'msg') else exc}", field=str(key)
        ) from exc
    except Exception as exc:  # yaml syntax errors
        raise ConfigError(f"cannot parse {path}: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must contain a mapping at the top level, got {type(data).__name__}")
    return {str(key): value for key, value in data.items()}


def validate_config(raw: dict[str, Any]) -> TrinityConfig:
    """Validate the tree and every stage (merged over the globals); raise ConfigError naming every
    problem found (services/common/config/diagnose.py), the first one's key as its field."""
    from services.common.config.diagnose import diagnose

    cfg, problems = diagnose(raw)
    if problems:
        raise ConfigError("\n".join(p.message for p in problems), field=problems[0].field)
    assert cfg is not None  # a tree that does not validate has a problem
    return cfg


def merge_stage(raw: dict[str, Any], stage: dict[str, Any]) -> dict[str, Any]:
    """The raw tree of one stage: the globals with the stage's sections merged over them."""
    base = {k: v for k, v in raw.items() if k != "stages"}
    overrides = {k: v for k, v in stage.items() if k not in ("stage_name",)}
    merged = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overrides)))
    assert isinstance(merged, dict)
    merged["name"] = f"{raw.get('name', TrinityConfig.model_fields['name'].default)}/{stage['stage_name']}"
    return merged  # type: ignore[return-value]
