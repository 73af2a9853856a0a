"""The "Trinity-RFT v0.6 compatibility" part of docs/config.md: the 49 keys Trinity v0.6 adds, each
with its status here, and the tally of v0.6's example configs (tests/data/trinity-v0.6-examples)
through the loader. tests/unit/common/config/test_trinity_v06_compat.py prints the fuller tally of
`trinity config check` (registries and files too) with -s."""

from __future__ import annotations

from scripts.trinity_compat_doc import (
    EXAMPLES_V06,
    TRINITY_KEYS_FILE,
    TRINITY_V06_KEYS_FILE,
    describe,
    our_key_paths,
    refused_table,
    schema_gap,
    tally,
    trinity_keys,
)

LEFT_TO_FULLY_ASYNC = "not yet: another part of issue 33 (sync_style fully_async) gives it its meaning; an unknown key until then"


def new_keys() -> list[str]:
    """The keys Trinity v0.6 adds to v0.5.2's."""
    return sorted(set(trinity_keys(TRINITY_V06_KEYS_FILE)) - set(trinity_keys(TRINITY_KEYS_FILE)))


def status_of(key: str, gap: set[str], schema: set[str]) -> tuple[str, str]:
    """(status, what it does here) of a key new in v0.6."""
    from services.common.config.trinity_keys import meaning_of

    entry = meaning_of(key)
    if entry is not None:
        return entry.status, describe(entry)
    if key in gap:
        return "not yet", LEFT_TO_FULLY_ASYNC
    if key in schema:
        return "same", "Trinity's name and meaning: see its row in the reference above"
    return "same", "inside a section of ours that checks it (see the reference above)"


def render_v06() -> list[str]:
    outcomes, total = tally(EXAMPLES_V06, keep_defaults=True)
    gap, keys_total = schema_gap(TRINITY_V06_KEYS_FILE)
    schema, _leaves = our_key_paths()
    keys = new_keys()
    lines = [
        "## Trinity-RFT v0.6 compatibility",
        "",
        f"Trinity v0.6 (its main branch after v0.5.2) has {keys_total} user-facing keys",
        "(tests/data/trinity_v06_keys.txt, read from its trinity/common/config.py): v0.5.2's, none removed,",
        f"and the {len(keys)} below. "
        + (
            "Every one has a meaning here."
            if not gap
            else f"All but {len(gap)} have a meaning here; those ({', '.join(gap)}) belong to `sync_style: "
            "fully_async`, another part of issue 33, and are refused as unknown keys until it lands."
        ),
        "",
        f"Tally of Trinity v0.6's {total} example configs (plus one workflow-arguments file, not a config),",
        "loaded unchanged; an environment variable read with a default (`${oc.env:VAR,default}`) keeps",
        "its default, the others are set to stand-ins:",
        "",
        "| outcome | configs |",
        "| --- | --- |",
        f"| every key understood, the file loads | {outcomes['loads']} |",
        f"| every key known, a value or key refused with its reason | {outcomes['value rejected']} |",
        f"| stopped by a key with no meaning here | {outcomes['unknown key']} |",
        "",
        "The refused values, by key (every problem of each config; a config can have several):",
        "",
        *refused_table(outcomes),
        "",
        "`trinity config check` then also looks up the algorithm, workflow, reward and operator names",
        "and the files; `pytest -s tests/unit/common/config/test_trinity_v06_compat.py` prints that tally.",
        "",
        f"The {len(keys)} keys new in v0.6 (*same*: in the schema above with Trinity's name and meaning):",
        "",
        "| Trinity key | since | status | what it does here |",
        "| --- | --- | --- | --- |",
    ]
    for key in keys:
        status, what = status_of(key, set(gap), schema)
        lines.append(f"| `{key}` | v0.6 | {status} | {what} |")
    lines.append("")
    return lines
