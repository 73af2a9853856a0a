"""The "Trinity-RFT v0.5.2 compatibility" part of docs/config.md: the key table
(services/common/config/trinity_keys.py) and the tally of the 55 example configs
(tests/data/trinity-v0.5.2-examples) through the loader; and what both compatibility parts share
(the key lists, the example configs and their environment, the tally; v0.6's: trinity_v06_doc.py).

The tally counts what the schema decides (a config loads, or a value is rejected with a reason, or
an unknown key stops it), so it changes only with the schema; names in registries and files are
`trinity config check`'s part and are counted by tests/unit/common/config/test_trinity_compat.py (run it with -s).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from services.explorer.workflows.cod.unpublished import WHERE as UNPUBLISHED

if TYPE_CHECKING:
    from services.common.config.key_meaning import KeyMeaning

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "trinity-v0.5.2-examples"
EXAMPLES_V06 = EXAMPLES.parent / "trinity-v0.6-examples"
NOT_A_CONFIG = "grpo_gsm8k_experience_pipeline/dj_scoring_exp.yaml"  # a Data-Juicer recipe
NOT_A_CONFIG_V06 = "agentscope_gomoku/gomoku_agent.yaml"  # a workflow-arguments file
TRINITY_KEYS_FILE = EXAMPLES.parent / "trinity_v052_keys.txt"
TRINITY_V06_KEYS_FILE = EXAMPLES.parent / "trinity_v06_keys.txt"


def refused_table(outcomes: Counter[str] | dict[str, int]) -> list[str]:
    """The markdown table of refused keys (outcomes `refused: KEY`), most configs first."""
    return [
        "| refused key | configs |",
        "| --- | --- |",
        *(
            f"| `{key.removeprefix('refused: ')}` | {count} |"
            for key, count in sorted(outcomes.items(), key=lambda kv: (-kv[1], kv[0]))
            if key.startswith("refused: ")
        ),
    ]


def example_configs(folder: pathlib.Path = EXAMPLES) -> list[pathlib.Path]:
    """The Trinity run configs among the example files of `folder` (EXAMPLES or EXAMPLES_V06)."""
    skip = {NOT_A_CONFIG, NOT_A_CONFIG_V06}
    return sorted(p for p in folder.rglob("*.yaml") if str(p.relative_to(folder)) not in skip)


def stand_in_env(paths: list[pathlib.Path], root: str, *, keep_defaults: bool) -> dict[str, str | None]:
    """The environment the example configs are loaded with: each `${oc.env:NAME}` they read gets a
    stand-in path under `root`; with keep_defaults, a variable every use of which has a default
    (`${oc.env:NAME,default}`) is unset instead, so the config's own default applies (None: unset)."""
    uses = [m for p in paths for m in re.findall(r"oc\.env:([A-Z_0-9]+)(,?)", p.read_text())]
    without_default = {name for name, comma in uses if not comma}
    return {
        name: None if keep_defaults and name not in without_default else f"{root}/{name.lower()}"
        for name in sorted({name for name, _comma in uses})
    }


@contextlib.contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            _set(name, value)
        yield
    finally:
        for name, value in saved.items():
            _set(name, value)


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def kind_of(problem: str) -> str:
    """unknown key (no meaning here), missing file (data, models), missing part (an algorithm,
    workflow, reward fn, operator or package this project does not have), or rejected value."""
    if "unknown key" in problem and "[Trinity key" not in problem:  # with one, its entry says why
        return "unknown key"
    if "does not exist" in problem:
        return "missing file"
    if re.search(
        r"unknown (workflow|reward function|experience operator|algorithm|advantage|policy_loss|sample)",
        problem,
    ):
        return "missing part"
    if "needs the" in problem and "package" in problem:
        return "missing part"
    if re.search(r"cannot import workflow '(examples|trinity)\.", problem):  # one of Trinity's own modules
        return "missing part"
    if UNPUBLISHED in problem:  # a workflow Trinity names but never published (cod/unpublished.py)
        return "missing part"
    return "rejected value"


def refused_key(problem: str) -> str:
    """The key a problem line names: its first key path, or the key its message starts with
    (`section: format.image_key ...`); a stage's prefix and list indices are left out."""
    line = re.sub(r"^stages\[\d+\]\.", "", problem)
    first = re.split(r"[ :]", line, maxsplit=1)[0]
    rest = line[len(first) :].lstrip(": ")
    named = re.match(r"([A-Za-z_]\w*(?:\.\w+|\[\d*\])+)[ :]", rest)
    key = re.sub(
        r"\[\d*\]", "[*]", named.group(1) if named and not named.group(1).startswith(first) else first
    )
    verl = key.removeprefix("trainer.trainer_config.")
    if verl != key:  # a veRL leaf: counted under the pattern of its rule (services/common/config/verl.py)
        from services.common.config.verl import rule_for

        rule = rule_for(verl)
        return f"trainer.trainer_config.{rule.pattern}" if rule else key
    return key


def tally(folder: pathlib.Path = EXAMPLES, *, keep_defaults: bool = False) -> tuple[Counter[str], int]:
    """(configs per outcome of loading: loads / value rejected / unknown key, and per refused key,
    number of Trinity configs). The loader's part only: names in registries and files are
    `trinity config check`'s, counted by the compatibility tests."""
    from services.common.config import load_raw
    from services.common.config.diagnose import diagnose
    from services.common.errors import ConfigError

    paths = example_configs(folder)
    outcomes: Counter[str] = Counter()
    with environment(stand_in_env(paths, "/stand-in", keep_defaults=keep_defaults)):
        for path in paths:
            try:
                problems = [p.message for p in diagnose(load_raw(path))[1]]
            except ConfigError as exc:
                problems = [str(exc)]
            if not problems:
                outcomes["loads"] += 1
                continue
            lines = [line for p in problems for line in p.splitlines()]
            unknown = any(kind_of(line) == "unknown key" for line in lines)
            outcomes["unknown key" if unknown else "value rejected"] += 1
            for key in sorted({refused_key(line) for line in lines if kind_of(line) != "unknown key"}):
                outcomes[f"refused: {key}"] += 1
    return outcomes, len(paths)


def describe(entry: KeyMeaning) -> str:
    """A key's meaning and the values accepted, for a table cell."""
    from services.common.config.trinity_keys import ANY

    values = ""
    if entry.accepts and entry.accepts is not ANY:
        values = f" (accepted: {', '.join(repr(v) for v in entry.accepts)})"
    elif entry.accepts:
        values = " (any value accepted)"
    return f"{entry.meaning.replace('|', '/')}{values}"


def render_compat() -> list[str]:
    from services.common.config.trinity_keys import TRINITY_KEYS
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
        f"| every key known, a value or key refused with its reason (e.g. multi-modal rows) | {outcomes['value rejected']} |",
        f"| stopped by a key with no meaning here yet | {outcomes['unknown key']} |",
        "",
        "The refused values, by key (every problem of each config, `trinity config check` style; a config",
        "can have several; the key's entry below or its schema docstring says why and what to use instead):",
        "",
        *refused_table(outcomes),
        "",
        "`trinity config check` then also looks up the algorithm, workflow, reward and operator names",
        "and the files; `pytest -s tests/unit/common/config/test_trinity_compat.py` prints that fuller tally.",
        "",
        "*since*: the Trinity release that has the key (v0.6: one of the 49 keys v0.6 adds, see the",
        "next section).",
        "",
        "| Trinity key | since | status | what it does here |",
        "| --- | --- | --- | --- |",
    ]
    new_in_v06 = set(trinity_keys(TRINITY_V06_KEYS_FILE)) - set(trinity_keys(TRINITY_KEYS_FILE))
    for key, entry in sorted(TRINITY_KEYS.items()):
        since = "v0.6" if key in new_in_v06 else "v0.5.2"
        lines.append(f"| `{key}` | {since} | {entry.status} | {describe(entry)} |")
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
