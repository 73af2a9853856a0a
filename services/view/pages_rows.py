"""The experiences pages: the filtered table, a group side by side, one experience in full."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from services.common.errors import NotFound
from services.common.experience import Experience
from services.common.wire import experience_from_proto
from services.view import query
from services.view.detail import Shown, decode
from services.view.html import esc, href, link, num, table, td_num, tokens_html
from services.view.pages_run import frame
from services.view.run_dir import Stage
from services.view.tokens import Decoder
from services.view.viewer import Viewer
from trinity_grpc.common.v1 import common_pb2 as pb


def shown_rows(
    v: Viewer, conn: sqlite3.Connection, stage: Stage, rows: list[dict[str, Any]]
) -> tuple[list[Shown], Decoder]:
    """Rows decoded, with their advantages recomputed over their groups."""
    decoder = v.decoders.for_config(stage.cfg)
    blobs = query.payloads(conn, [r["id"] for r in rows])
    shown = [decode(r, blobs.get(r["id"]), decoder) for r in rows]
    groups: dict[str, list[Experience]] = {}
    for gid in {s.row["group_id"] for s in shown if s.exp is not None and s.advantage is None}:
        members = query.group_rows(conn, stage.name, gid) if gid else []
        member_blobs = query.payloads(conn, [m["id"] for m in members])
        groups[gid] = [
            experience_from_proto(pb.Experience.FromString(member_blobs[m["id"]])) for m in members
        ]
    v.advantages.fill(stage.cfg, shown, groups)
    return shown, decoder


def _parts(exp: Experience | None) -> str:
    if exp is None or not exp.metrics:
        return '<span class="muted">—</span>'
    return "<br>".join(f"{esc(k)}={num(float(val), 3)}" for k, val in sorted(exp.metrics.items()))


def _advantage_text(s: Shown) -> str:
    return "dropped" if s.dropped else num(s.advantage, 3)


def _advantage(s: Shown) -> str:
    return f'<td class="num" title="{esc(s.advantage_note)}">{_advantage_text(s)}</td>'


def _tokens_legend(decoder: Decoder) -> str:
    source = (
        f"decoded with the tokenizer {esc(decoder.source)}"
        if decoder.has_text
        else f"<b>token ids</b>, not text: {esc(decoder.reason)}"
    )
    return (
        '<div class="legend-box">Response tokens: <span class="tok t">trained</span> (action mask 1), '
        f'<span class="tok u">not trained</span> (mask 0); hover a token for its id and logprob. {source}</div>'
    )


def _row_cells(s: Shown, stage: str, decoder: Decoder) -> list[str]:
    r = s.row
    flat = ' <span class="muted">flat</span>' if r["flat"] else ""
    prompt = (
        tokens_html(s.prompt, has_text=decoder.has_text)
        if s.exp
        else f'<span class="error">{esc(s.error)}</span>'
    )
    return [
        link("/experience", str(r["id"]), id=r["id"]),
        td_num(r["step"]),
        td_num(r["model_version"]),
        td_num(r["trained_step"]),
        td_num(s.staleness),
        link("/experiences", r["task_id"], stage=stage, task=r["task_id"]),
        td_num(r["run_id"]),
        f'<td class="num reward">{num(r["reward"], 4)}</td>',
        _parts(s.exp),
        _advantage(s),
        f'<td class="num">{num(s.logprob_mean, 3)} / {num(s.logprob_min, 3)}</td>',
        f'<td class="num">{r["prompt_tokens"]} + {r["response_tokens"]} ({s.trained_tokens})</td>',
        link("/group", "group", stage=stage, id=r["group_id"]) + flat if r["group_id"] else "—",
        prompt,
        tokens_html(s.response, has_text=decoder.has_text),
    ]


ROW_HEADERS = [
    "id",
    "step",
    "version",
    "trained at",
    "staleness",
    "task",
    "run",
    "reward",
    "reward parts",
    "advantage",
    "logprob mean / min",
    "tokens (trained)",
    "group",
    "prompt",
    "response",
]


def _filter_form(f: query.Filters) -> str:
    def box(name: str, label: str, value: Any) -> str:
        return (
            f'<label>{esc(label)}<input name="{name}" value="{esc("" if value is None else value)}"></label>'
        )

    def select(name: str, label: str, options: dict[str, str], current: str) -> str:
        opts = "".join(
            f'<option value="{esc(k)}"{" selected" if k == current else ""}>{esc(text)}</option>'
            for k, text in options.items()
        )
        return f'<label>{esc(label)}<select name="{name}">{opts}</select></label>'

    flat = {"": "all groups", "only": "flat groups only", "none": "groups with signal"}
    sorts = {
        "newest": "newest first",
        "oldest": "oldest first",
        "reward": "worst reward first",
        "-reward": "best reward first",
    }
    return (
        f'<form class="filters" method="get" action="/experiences"><input type="hidden" name="stage" value="{esc(f.stage)}">'
        + box("step", "explorer step", f.step)
        + box("reward_min", "reward ≥", f.reward_min)
        + box("reward_max", "reward ≤", f.reward_max)
        + select("flat", "flat groups", flat, f.flat)
        + box("task", "task id", f.task)
        + select("sort", "order", sorts, f.sort)
        + box("per_page", "rows/page", f.per_page)
        + f'<button type="submit" id="apply">filter</button> <a href="{href("/experiences", stage=f.stage)}">clear</a></form>'
    )


def _pager(p: query.Page) -> str:
    f = p.filters
    prev = (
        f'<a href="/experiences?{esc(f.query_string(page=f.page - 1))}" id="prev">previous</a>'
        if f.page > 1
        else ""
    )
    nxt = (
        f'<a href="/experiences?{esc(f.query_string(page=f.page + 1))}" id="next">next</a>'
        if f.page < p.pages
        else ""
    )
    return (
        f'<div class="pager"><span id="total" data-total="{p.total}">{p.total} rows</span>'
        f"<span>page {f.page} of {p.pages}</span>{prev}{nxt}</div>"
    )


def new_rows_fragment(v: Viewer, f: query.Filters, seen: int) -> str:
    with v.reader() as conn:
        sql, args = query.count_sql(f)
        total = int(conn.execute(sql, args).fetchone()[0])
    if total <= seen:
        return ""
    return (
        f'<div class="notice" id="new-rows">{total - seen} new rows match: '
        f'<a href="/experiences?{esc(f.query_string(page=1))}">reload</a></div>'
    )


def experiences_page(v: Viewer, stage: Stage, f: query.Filters) -> str:
    with v.reader() as conn:
        p = query.fetch_page(conn, f)
        shown, decoder = shown_rows(v, conn, stage, p.rows)
    body = _filter_form(f) + '<div data-live="new"></div>' + _pager(p) + _tokens_legend(decoder)
    body += table(ROW_HEADERS, (_row_cells(s, stage.name, decoder) for s in shown), table_id="rows")
    poll = f"/api/new?{f.query_string()}&seen={p.total}"
    return frame(v, f"{stage.name}: experiences", body, active="experiences", stage=stage.name, poll=poll)


def group_page(v: Viewer, stage: Stage, group_id: str) -> str:
    with v.reader() as conn:
        rows = query.group_rows(conn, stage.name, group_id)
        if not rows:
            raise NotFound(f"no group {group_id!r} in stage {stage.name!r}", field="id")
        shown, decoder = shown_rows(v, conn, stage, rows)
    rewards = [r["reward"] for r in rows]
    first = shown[0]
    head = (
        f"<p>task {link('/experiences', rows[0]['task_id'], stage=stage.name, task=rows[0]['task_id'])} · "
        f"explorer step {rows[0]['step']} · {len(rows)} samples · rewards {', '.join(num(x, 3) for x in rewards)}"
        + (" · <b>flat</b> (every reward equal: no signal)" if rows[0]["flat"] else "")
        + "</p>"
    )
    prompt = tokens_html(first.prompt, has_text=decoder.has_text) if first.exp else ""
    cards = "".join(
        f'<div class="card sample"><div><b>run {s.row["run_id"]}</b> · {link("/experience", "#" + str(s.row["id"]), id=s.row["id"])}'
        f' · reward <b>{num(s.row["reward"], 4)}</b> · advantage <span title="{esc(s.advantage_note)}">'
        f"{_advantage_text(s)}</span> · v{s.row['model_version']}</div><div>{_parts(s.exp)}</div>"
        f"{tokens_html(s.response, has_text=decoder.has_text)}</div>"
        for s in shown
    )
    body = (
        head
        + _tokens_legend(decoder)
        + f"<h2>prompt</h2>{prompt}<h2>samples</h2><div class=group>{cards}</div>"
    )
    return frame(v, f"group {group_id}", body, active="experiences", stage=stage.name)


def experience_page(v: Viewer, row_id: int) -> str:
    with v.reader() as conn:
        rows = query.fetch_rows(conn, [row_id])
        if not rows:
            raise NotFound(f"no experience with id {row_id} in the index", field="id")
        stage = v.run.stage(rows[0]["stage"])
        shown, decoder = shown_rows(v, conn, stage, rows)
    s = shown[0]
    facts = table(["field", "value"], [[esc(k), esc(val)] for k, val in s.row.items()])
    body = _tokens_legend(decoder) + f"<h2>prompt</h2>{tokens_html(s.prompt, has_text=decoder.has_text)}"
    body += f"<h2>response</h2>{tokens_html(s.response, has_text=decoder.has_text)}"
    if s.exp is not None:
        extra = {
            "reward parts (metrics)": s.exp.metrics,
            "info": s.exp.info,
            "prompt_text": s.exp.prompt_text,
            "response_text": s.exp.response_text,
            "messages": [m.__dict__ for m in s.exp.messages],
        }
        body += "<h2>payload</h2>" + table(
            ["field", "value"],
            [
                [esc(k), f"<pre>{esc(json.dumps(val, indent=1, default=str))}</pre>"]
                for k, val in extra.items()
            ],
        )
    body += f"<p>advantage {_advantage_text(s)} ({esc(s.advantage_note)}); staleness {num(s.staleness)}</p>"
    body += "<h2>index row</h2>" + facts
    return frame(v, f"experience {row_id}", body, active="experiences", stage=stage.name)
