"""Filters of the experiences page: parsing with errors naming the parameter, the WHERE clause,
the index each combination reads, links that keep the other filters."""

from __future__ import annotations

import urllib.parse

import pytest

from services.common.errors import InvalidArgument
from services.view.query import Filters, count_sql, page_sql


def test_defaults_show_a_stage_newest_first() -> None:
    f = Filters.parse({}, "grpo")
    assert (f.stage, f.sort, f.page, f.per_page) == ("grpo", "newest", 1, 50)
    assert f.where() == ("stage = ?", ["grpo"])
    assert f.index() == "ix_rows_stage"


def test_every_filter_narrows_the_where_clause() -> None:
    f = Filters.parse(
        {"stage": "s", "step": "30", "reward_min": "-1", "reward_max": "0.5", "flat": "none", "task": " t7 "},
        "x",
    )
    assert f.where() == (
        "stage = ? AND step = ? AND reward >= ? AND reward <= ? AND flat = ? AND task_id = ?",
        ["s", 30, -1.0, 0.5, 0, "t7"],
    )


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"step": "abc"}, "step", "step must be a whole number, got 'abc'"),
        ({"step": "-1"}, "step", "step must be in 0..inf, got -1"),
        ({"reward_min": "x"}, "reward_min", "reward_min must be a number"),
        ({"reward_max": "nan"}, "reward_max", "reward_max must be a finite number"),
        ({"reward_min": "1", "reward_max": "0"}, "reward_min", "reward_min (1) is above reward_max (0)"),
        ({"flat": "yes"}, "flat", "flat must be one of '', 'only', 'none'"),
        ({"sort": "up"}, "sort", "sort must be one of"),
        ({"per_page": "501"}, "per_page", "per_page must be in 1..500"),
        ({"page": "0"}, "page", "page must be in 1..inf"),
    ],
)
def test_bad_values_name_their_parameter(params, field, message) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        Filters.parse(params, "s")
    assert err.value.field == field


@pytest.mark.parametrize(
    ("params", "page_index", "count_index"),
    [
        ({"step": "3", "task": "1", "sort": "reward"}, "ix_rows_step", "ix_rows_step"),
        ({"task": "1", "flat": "only"}, "ix_rows_task", "ix_rows_task"),
        ({"flat": "only"}, "ix_rows_flat", "ix_rows_flat"),
        ({"flat": "only", "sort": "reward"}, "ix_rows_reward", "ix_rows_flat"),
        ({"reward_min": "0.5"}, "ix_rows_reward", "ix_rows_reward"),
        ({"sort": "-reward"}, "ix_rows_reward", "ix_rows_stage"),
        ({"sort": "oldest"}, "ix_rows_stage", "ix_rows_stage"),
    ],
)
def test_the_index_is_chosen_by_the_most_selective_filter(params, page_index, count_index) -> None:
    f = Filters.parse(params, "s")
    assert f"INDEXED BY {page_index} " in page_sql(f)[0]
    assert f"INDEXED BY {count_index} " in count_sql(f)[0]


def test_page_sql_limits_and_offsets() -> None:
    sql, args = page_sql(Filters.parse({"page": "3", "per_page": "20", "sort": "-reward"}, "s"))
    assert sql.endswith("ORDER BY reward DESC, id DESC LIMIT ? OFFSET ?")
    assert args == ["s", 20, 40]


def test_query_string_keeps_the_filters_and_drops_defaults() -> None:
    f = Filters.parse({"step": "4", "flat": "only", "page": "2"}, "grpo")
    assert urllib.parse.parse_qs(f.query_string(page=3)) == {
        "stage": ["grpo"],
        "step": ["4"],
        "flat": ["only"],
        "page": ["3"],
    }
    assert Filters.parse(dict(urllib.parse.parse_qsl(f.query_string())), "x") == f
