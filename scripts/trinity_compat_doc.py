"""The "Trinity-RFT v0.5.2 compatibility" part of docs/config.md: the key table
(services/common/config/trinity_keys.py) and the tally of the 55 example configs
(tests/data/trinity-v0.5.2-examples) through the loader.

The tally counts what the schema decides (a config loads, or a value is rejected with a reason, or
an unknown key stops it), so it changes only with the schema; names in registries and files are
`trinity config check`'s part and are counted by tests/unit/test_trinity_compat.py (run it with -s).
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
    from services.common.config.trinity_keys import TRINITY_KEYS
    from services.common.config.verl import RULES

    outcomes, total = tally()
    lines = [
        "## Trinity-RFT v0.5.2 compatibility",
        "",
        "Keys of the tables above with Trinity's name have Trinity's meaning. The Trinity keys below",
        "differ: *mapped* (accepted and carried to our equivalent), *rejected* (a value refused, with the",
        "reason), *not yet* (refused as an unknown key; the error quotes this table; none is left).",
        "Nothing is accepted and ignored. The table lives in",
        "`services/common/config/trinity_keys.py`; keys not listed there and not in the schema are unknown keys.",
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
        "and the files; `pytest -s tests/unit/test_trinity_compat.py` prints that fuller tally.",
        "",
        "| Trinity key | status | what it does here |",
        "| --- | --- | --- |",
    ]
    for key, entry in sorted(TRINITY_KEYS.items()):
        lines.append(f"| `{key}` | {entry.status} | {entry.meaning.replace('|', '/')} |")
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
