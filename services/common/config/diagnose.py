"""Every problem of a config tree in one pass, not just the first stage of them.

Validation happens in stages that hide each other: a key refused by its Trinity entry (strip_inert)
stops the schema from running; a section whose fields fail never runs its cross-field checks; a tree
that does not validate gets none of `trinity config check`'s later checks. `diagnose` collects the
problems of each stage, takes the offending key out of the tree (the value it would have without
that key is the default) and validates again, until the tree validates or no key can be blamed. It
returns every problem found and, when the repaired tree validates, the config it gives, on which the
later checks still run (services/cli/config_check.py). The repaired config is for finding more
problems only: `validate_config` raises when there is any.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from services.common.config.messages import NAMED_KEY, dotted, format_error
from services.common.config.resolve import resolve_derived
from services.common.config.schema import TrinityConfig
from services.common.config.tasksets import resolve_tasksets, training_conflicts
from services.common.config.trinity_keys import strip_inert

MAX_ROUNDS = 50
"""Validations per tree (each round takes one or more keys out)."""

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    """One refused key: `field` is its dotted path, `message` the whole line shown to the user."""

    field: str
    message: str


def diagnose(raw: dict[str, Any]) -> tuple[TrinityConfig | None, list[Problem]]:
    """(the config of `raw` with the offending keys taken out, or None when that does not validate
    either; every problem found), stages included."""
    problems: list[Problem] = []
    cfg, repaired = _tree(raw, "", problems)
    if cfg is None:
        return None, problems
    stage_configs: list[TrinityConfig | None] = []
    seen: set[str] = set()
    from services.common.config.loader import merge_stage

    for index, stage in enumerate(cfg.stages):
        if stage.stage_name in seen:
            field = f"stages[{index}].stage_name"
            problems.append(Problem(field, f"{field}: duplicate stage_name {stage.stage_name!r}"))
        seen.add(stage.stage_name)
        merged = merge_stage(repaired, stage.model_dump(exclude_none=True))
        stage_configs.append(_tree(merged, f"stages[{index}].", problems)[0])
    if any(stage is None for stage in stage_configs):
        return None, problems
    cfg._stage_configs = [stage for stage in stage_configs if stage is not None]
    return cfg, problems


def _tree(
    raw: dict[str, Any], prefix: str, problems: list[Problem]
) -> tuple[TrinityConfig | None, dict[str, Any]]:
    """Validate one tree (the globals or a stage), repairing it; (config or None, the repaired tree)."""
    refused: list[tuple[str, str]] = []
    tree = strip_inert(raw, refused=refused)
    problems += [Problem(prefix + path, prefix + message) for path, message in refused]
    removed: set[Loc] = set()
    reported: set[str] = set()
    for _round in range(MAX_ROUNDS):
        try:
            cfg = TrinityConfig.model_validate(tree)  # algorithm presets are applied here (AlgorithmConfig)
        except ValidationError as exc:
            culprits = []
            for err in exc.errors():
                loc = tuple(err["loc"])
                culprit = _culprit(tree, err)
                line = format_error(err, prefix)
                caused_by_repair = err["type"] == "missing" and loc in removed
                if line not in reported and not caused_by_repair:
                    reported.add(line)
                    named = culprit if culprit and err["type"] == "value_error" else loc
                    problems.append(Problem(prefix + dotted(named), line))
                culprits.append(culprit)
            if any(c is None for c in culprits):
                return None, tree
            for culprit in culprits:
                assert culprit is not None
                tree = _without(tree, culprit)
                removed.add(culprit)
            continue
        conflicts = training_conflicts(cfg)
        for key, conflict in conflicts:
            problems.append(Problem(prefix + dotted(key), prefix + conflict))
            tree = _without(tree, key)  # so that the stages, merged over the tree, do not repeat it
        if conflicts:
            cfg = TrinityConfig.model_validate(tree)
        return resolve_derived(resolve_tasksets(cfg)), tree
    return None, tree


def _culprit(tree: dict[str, Any], err: Any) -> Loc | None:
    """The key to take out of `tree` for pydantic error `err`: the key a validator's message names
    (`model.enable_prompt_truncation: ...`), else the deepest key of the error's location that the
    tree has; None when there is none (a required value missing at the top)."""
    loc: Loc = tuple(err["loc"])
    if err["type"] == "missing":
        loc = loc[:-1]  # the mapping that lacks it
    named = NAMED_KEY.match(str(err.get("msg", "")).removeprefix("Value error, "))
    if named:
        path = _loc_of(named.group(1))
        if path and _has(tree, path) and path[: len(_existing(tree, loc))] == _existing(tree, loc):
            return path
    found = _existing(tree, loc)
    return found or None


def _loc_of(path: str) -> Loc:
    out: list[str | int] = []
    for part in path.split("."):
        name, *indices = re.split(r"\[(\d+)\]", part)
        out.append(name)
        out += [int(i) for i in indices if i != ""]
    return tuple(out)


def _existing(tree: Any, loc: Sequence[str | int]) -> Loc:
    """The longest start of `loc` that names something in `tree`."""
    node, out = tree, []
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            break
        out.append(part)
    return tuple(out)


def _has(tree: Any, loc: Loc) -> bool:
    return len(_existing(tree, loc)) == len(loc)


def _without(tree: dict[str, Any], loc: Loc) -> dict[str, Any]:
    """A copy of `tree` without the key (or list item) at `loc`, and without the mappings that
    leaves empty (an empty mapping may mean something else than a missing one, e.g. a veRL leaf)."""
    out = copy.deepcopy(tree)
    for depth in range(len(loc), 0, -1):
        node: Any = out
        for part in loc[: depth - 1]:
            node = node[part]
        try:
            del node[loc[depth - 1]]
        except (KeyError, IndexError, TypeError):
            break
        if depth == 1 or node:
            break
    return out
