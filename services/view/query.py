"""Filters of the experiences page and the paged SQL over the index (services/view/index.py).

Every filter narrows an indexed column: `step` uses (stage, step, reward), `flat` (stage, flat),
a reward range (stage, reward), `task` (stage, task_id, step); the whole stage (stage) in id order. The page
query names its index (`Filters.index`); pages are LIMIT/OFFSET over that order; tests check the plans with EXPLAIN QUERY PLAN and
benchmarks/view_pages.py times them on a 100k-row buffer.
"""

from __future__ import annotations

import math
import sqlite3
import urllib.parse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from services.common.errors import InvalidArgument

SORTS = {
    "newest": "id DESC",
    "oldest": "id ASC",
    "reward": "reward ASC, id ASC",
    "-reward": "reward DESC, id DESC",
}
FLAT = {"": None, "only": 1, "none": 0}
PER_PAGE_MAX = 500
COLUMNS = (
    "id, stage, buffer, step, model_version, task_id, run_id, group_id, reward, prompt_tokens, "
    "response_tokens, created_at, trained_step, flat"
)


def _int(
    params: Mapping[str, str], name: str, *, low: int | None = None, high: int | None = None
) -> int | None:
    raw = params.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be a whole number, got {raw!r}", field=name) from None
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{low if low is not None else '-inf'}..{high if high is not None else 'inf'}"
        raise InvalidArgument(f"{name} must be in {bounds}, got {value}", field=name)
    return value


def _float(params: Mapping[str, str], name: str) -> float | None:
    raw = params.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be a number, got {raw!r}", field=name) from None
    if not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number, got {raw!r}", field=name)
    return value


def _choice(params: Mapping[str, str], name: str, allowed: Mapping[str, Any], default: str) -> str:
    value = params.get(name, default).strip()
    if value not in allowed:
        raise InvalidArgument(
            f"{name} must be one of {', '.join(repr(k) for k in allowed)}, got {value!r}", field=name
        )
    return value


@dataclass(frozen=True)
class Filters:
    """What the experiences page shows: a stage's rows narrowed by step, reward, flat groups, task."""

    stage: str
    step: int | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    flat: str = ""  # "": every row; "only": rows of flat groups; "none": rows of groups with signal
    task: str = ""
    sort: str = "newest"
    page: int = 1
    per_page: int = 50

    @classmethod
    def parse(cls, params: Mapping[str, str], default_stage: str) -> Filters:
        """From a query string's values; InvalidArgument naming the parameter for a bad one."""
        filters = cls(
            stage=params.get("stage", "").strip() or default_stage,
            step=_int(params, "step", low=0),
            reward_min=_float(params, "reward_min"),
            reward_max=_float(params, "reward_max"),
            flat=_choice(params, "flat", FLAT, ""),
            task=params.get("task", "").strip(),
            sort=_choice(params, "sort", SORTS, "newest"),
            page=_int(params, "page", low=1) or 1,
            per_page=_int(params, "per_page", low=1, high=PER_PAGE_MAX) or 50,
        )
        if (
            filters.reward_min is not None
            and filters.reward_max is not None
            and filters.reward_min > filters.reward_max
        ):
            raise InvalidArgument(
                f"reward_min ({filters.reward_min:g}) is above reward_max ({filters.reward_max:g})",
                field="reward_min",
            )
        return filters

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = ["stage = ?"]
        args: list[Any] = [self.stage]
        if self.step is not None:
            clauses.append("step = ?")
            args.append(self.step)
        if self.reward_min is not None:
            clauses.append("reward >= ?")
            args.append(self.reward_min)
        if self.reward_max is not None:
            clauses.append("reward <= ?")
            args.append(self.reward_max)
        if FLAT[self.flat] is not None:
            clauses.append("flat = ?")
            args.append(FLAT[self.flat])
        if self.task:
            clauses.append("task_id = ?")
            args.append(self.task)
        return " AND ".join(clauses), args

    def index(self, *, ordered: bool = True) -> str:
        """The index a query of these filters reads: the most selective equality first, then one
        that gives the page's order (`ordered`; a count needs none). The planner has no statistics
        of the index file, so the choice is made here rather than guessed."""
        by_reward = ordered and self.sort in ("reward", "-reward")
        if self.step is not None:
            return "ix_rows_step"
        if self.task:
            return "ix_rows_task"
        if FLAT[self.flat] is not None and not by_reward:
            return "ix_rows_flat"
        if self.reward_min is not None or self.reward_max is not None or by_reward:
            return "ix_rows_reward"
        return "ix_rows_stage"

    def query_string(self, **changes: Any) -> str:
        """This filter set as a query string, with `changes` applied (defaults left out)."""
        values = asdict(replace(self, **changes))
        defaults = {f.name: f.default for f in fields(self) if f.name != "stage"}
        kept = {k: v for k, v in values.items() if k == "stage" or v != defaults[k]}
        return urllib.parse.urlencode({k: "" if v is None else v for k, v in kept.items()})


@dataclass
class Page:
    rows: list[dict[str, Any]]
    total: int
    filters: Filters

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.filters.per_page))


def _dicts(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def page_sql(filters: Filters) -> tuple[str, list[Any]]:
    where, args = filters.where()
    offset = (filters.page - 1) * filters.per_page
    sql = (
        f"SELECT {COLUMNS} FROM rows INDEXED BY {filters.index()} WHERE {where} "
        f"ORDER BY {SORTS[filters.sort]} LIMIT ? OFFSET ?"
    )
    return sql, [*args, filters.per_page, offset]


def count_sql(filters: Filters) -> tuple[str, list[Any]]:
    where, args = filters.where()
    return f"SELECT count(*) FROM rows INDEXED BY {filters.index(ordered=False)} WHERE {where}", args


def fetch_page(conn: sqlite3.Connection, filters: Filters) -> Page:
    sql, args = page_sql(filters)
    rows = _dicts(conn.execute(sql, args))
    csql, cargs = count_sql(filters)
    return Page(rows, int(conn.execute(csql, cargs).fetchone()[0]), filters)


def fetch_rows(conn: sqlite3.Connection, ids: list[int]) -> list[dict[str, Any]]:
    marks = ", ".join("?" * len(ids))
    return _dicts(conn.execute(f"SELECT {COLUMNS} FROM rows WHERE id IN ({marks}) ORDER BY id", ids))


def group_rows(conn: sqlite3.Connection, stage: str, group_id: str) -> list[dict[str, Any]]:
    """Every row of one group, by rollout index."""
    return _dicts(
        conn.execute(
            f"SELECT {COLUMNS} FROM rows WHERE stage = ? AND group_id = ? ORDER BY run_id, id",
            (stage, group_id),
        )
    )


def payloads(conn: sqlite3.Connection, ids: list[int]) -> dict[int, bytes]:
    if not ids:
        return {}
    marks = ", ".join("?" * len(ids))
    return {
        int(i): p for i, p in conn.execute(f"SELECT id, payload FROM payloads WHERE id IN ({marks})", ids)
    }


def step_summary(conn: sqlite3.Connection, stage: str) -> list[dict[str, Any]]:
    """Per explorer step: rows, mean / min / max reward, rows in flat groups, versions."""
    return _dicts(
        conn.execute(
            "SELECT step, count(*) AS rows, avg(reward) AS reward_mean, min(reward) AS reward_min, "
            "max(reward) AS reward_max, sum(flat) AS flat_rows, min(model_version) AS version_min, "
            "max(model_version) AS version_max, min(trained_step) AS trained_min, "
            "max(trained_step) AS trained_max FROM rows WHERE stage = ? GROUP BY step ORDER BY step",
            (stage,),
        )
    )


def stage_counts(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    """Per stage: rows indexed, rows trained, newest row (id, step, model version, time)."""
    out: dict[str, dict[str, Any]] = {}
    for stage, rows, trained, newest in conn.execute(
        "SELECT stage, count(*), count(trained_step), max(id) FROM rows GROUP BY stage"
    ):
        row = conn.execute(
            "SELECT step, model_version, created_at FROM rows WHERE id = ?", (newest,)
        ).fetchone()
        out[stage] = {
            "rows": rows,
            "trained": trained,
            "newest_step": row[0],
            "newest_version": row[1],
            "newest_at": row[2],
        }
    return out


def explain(conn: sqlite3.Connection, sql: str, args: list[Any]) -> list[str]:
    """SQLite's plan of a query, one detail line per step."""
    return [str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args)]
