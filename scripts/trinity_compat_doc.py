"""The "Trinity-RFT v0.5.2 compatibility" part of docs/config.md: the key table
(services/common/config/trinity_keys.py) and the tally of the 55 example configs
(tests/data/trinity-v0.5.2-examples) through the loader.

The tally counts what the schema decides (a config loads, or a value is rejected with a reason, or
an unknown key stops it), so it changes only with the schema; names in registries and files are
`trinity config check`'s part and are counted by tests/unit/common/config/test_trinity_compat.py (run it with -s).
"""

from __future__ import annotations

import os
import pathlib
import re
from collections import Counter

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "trinity-v0.5.2-examples"
NOT_A_CONFIG = "grpo_gsm8k_experience_pipeline/dj_scoring_exp.yaml"  # a Data-Juicer recipe


def tally() -> tuple[Counter[str], int]:
    """(configs per outcome: loads / value rejected / unknown key, number of Trinity configs)."""
    from services.common.config import load_config
    from services.common.errors import ConfigError

    paths = sorted(p for p in EXAMPLES.rglob("*.yaml") if str(p.relative_to(EXAMPLES)) != NOT_A_CONFIG)
    names = sorted({n for p in paths for n in re.findall(r"oc\.env:([A-Z_0-9]+)", p.read_text())})
    saved = {n: os.environ.get(n) for n in names}
    os.environ.update({n: f"/stand-in/{n.lower()}" for n in names})
    outcomes: Counter[str] = Counter()
    try:
        for path in paths:
            try:
                load_config(path)
                outcomes["loads"] += 1
            except ConfigError as exc:
                kind = "unknown key" if "unknown key" in str(exc) else "value rejected"
                outcomes[kind] += 1
                for key in sorted(set(re.findall(r"Value error, ([\w.]+)", str(exc)))):
                    outcomes[f"refused: {key}"] += 1
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return outcomes, len(paths)


def render_compat() -> list[str]:
    from services.common.config.trinity_keys import ANY, TRINITY_KEYS
    from services.common.config.verl import RULES

    outcomes, total = tally()
    gap, keys_total = schema_gap()
    lines = [
        "## Trinity-RFT v0.5.2 compatibility",
        "",
        "Keys of the tables above with Trinity's name have Trinity's meaning. The Trinity keys below",
        "differ: *mapped* (accepted and carried to our equivalent), *rejected* (a value refused, with the",
        "reason), *no effect* (a Trinity-only key accepted at the values that change nothing here,",
        "any other value refused with the reason), *not yet* (refused as an unknown key; the error",
        "quotes this table). Nothing is accepted and ignored. The table lives in",
        "`services/common/config/trinity_keys.py`; keys not listed there and not in the schema are unknown keys.",
        "",
        f"Trinity v0.5.2's schema has {keys_total} user-facing keys (tests/data/trinity_v052_keys.txt, read",
        "from its trinity/common/config.py); "
        + (
            "every one is in the schema above or in the table below."
            if not gap
            else f"{len(gap)} of them have no meaning here yet: {', '.join(gap)}."
        ),
        "",
        f"Tally of Trinity-RFT v0.5.2's {total} example configs (plus one Data-Juicer recipe, not a",
        "config), loaded unchanged with their environment variables set to stand-ins:",
        "",
        "| outcome | configs |",
        "| --- | --- |",
        f"| every key understood, the file loads | {outcomes['loads']} |",
        f"| every key known, a value rejected with its reason (e.g. Ulysses 2) | {outcomes['value rejected']} |",
        f"| stopped by a key with no meaning here yet | {outcomes['unknown key']} |",
        "",
        "The refused values, by key (a config can have several; the key's entry below or its schema",
        "docstring says why and what to use instead):",
        "",
        "| refused key | configs |",
        "| --- | --- |",
        *(
            f"| `{key.removeprefix('refused: ')}` | {count} |"
            for key, count in sorted(outcomes.items(), key=lambda kv: (-kv[1], kv[0]))
            if key.startswith("refused: ")
        ),
        "",
        "`trinity config check` then also looks up the algorithm, workflow, reward and operator names",
        "and the files; `pytest -s tests/unit/common/config/test_trinity_compat.py` prints that fuller tally.",
        "",
        "| Trinity key | status | what it does here |",
        "| --- | --- | --- |",
    ]
    for key, entry in sorted(TRINITY_KEYS.items()):
        values = ""
        if entry.accepts and entry.accepts is not ANY:
            values = f" (accepted: {', '.join(repr(v) for v in entry.accepts)})"
        elif entry.accepts:
            values = " (any value accepted)"
        lines.append(f"| `{key}` | {entry.status} | {entry.meaning.replace('|', '/')}{values} |")
    lines += [
        "",
        "### `trainer.trainer_config` (veRL) leaves",
        "",
        "First matching pattern wins (`*`: any part); a leaf no pattern matches is an error. *same*: the",
        "value is used for our key when that key is not set (both set and different: an error).",
        "",
        "| veRL leaf | meaning | here |",
        "| --- | --- | --- |",
    ]
    for rule in RULES:
        fine = f" ({', '.join(repr(v) for v in rule.accepts)} accepted)" if rule.accepts else ""
        lines.append(f"| `{rule.pattern}` | {rule.kind} | {rule.detail}{fine} |")
    lines.append("")
    return lines


TRINITY_KEYS_FILE = EXAMPLES.parent / "trinity_v052_keys.txt"
TRINITY_V06_KEYS_FILE = EXAMPLES.parent / "trinity_v06_keys.txt"


def trinity_keys(path: pathlib.Path = TRINITY_KEYS_FILE) -> list[str]:
    """The key paths of one of the key lists (tests/data/trinity_v052_keys.txt or trinity_v06_keys.txt)."""
    return [
        line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]


def our_key_paths() -> tuple[set[str], set[str]]:
    """(every key path of our schema, the paths of its leaves), with `[*]` for list items and `*`
    for dict values, as in tests/data/trinity_v052_keys.txt."""
    from pydantic import BaseModel

    from scripts.gen_config_docs import models_in
    from services.common.config.schema import TrinityConfig

    paths: set[str] = set()
    leaves: set[str] = set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            path = prefix + name
            paths.add(path)
            children = models_in(info.annotation)
            if not children:
                leaves.add(path)
            for child, suffix in children:
                walk(child, f"{path}{suffix.replace('[]', '[*]').replace('.<name>', '.*')}.")

    walk(TrinityConfig, "")
    return paths, leaves


def schema_gap(keys_file: pathlib.Path = TRINITY_KEYS_FILE) -> tuple[list[str], int]:
    """(Trinity user-facing keys of `keys_file` with no meaning here, number of its keys).

    A key has a meaning when our schema has it, when services/common/config/trinity_keys.py lists it
    (or a pattern there matches it), or when one of its parents is a free-form leaf of ours (a dict
    such as model.tinker or trainer.trainer_config, whose contents our validators decide on).
    """
    from services.common.config.trinity_keys import meaning_of

    keys = trinity_keys(keys_file)
    paths, leaves = our_key_paths()

    def known(key: str) -> bool:
        if key in paths or meaning_of(key.replace("stages[*].", "stages[0].")) is not None:
            return True
        parts = key.split(".")
        return any(".".join(parts[:i]) in leaves for i in range(1, len(parts)))

    return sorted(k for k in keys if not known(k)), len(keys)
