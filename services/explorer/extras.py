"""Optional packages a workflow or reward fn needs (alfworld, RM-Gallery, OpenJudge, ...): whether one
is installed (for `preflight`, which `trinity config check` reports), and importing one of its modules
with an error that names the package and how to install it."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from services.common.errors import FailedPrecondition


def installed(package: str) -> bool:
    """True when `package` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def import_extra(package: str, module: str, *, install: str, needed_by: str) -> Any:
    """`<package>.<module>`, or FailedPrecondition naming what needs it and the install command."""
    try:
        return importlib.import_module(f"{package}.{module}")
    except ImportError as exc:
        raise FailedPrecondition(
            f"{needed_by} needs the Python package {package!r}, which is not installed: {install} ({exc})",
            field="default_reward_fn_type",
        ) from exc
