"""HTML building blocks: the page frame, tables, numbers, tokens. Every value passes `esc`."""

from __future__ import annotations

import html
import math
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from services.view.detail import Token

NAV = (
    ("overview", "/", "Overview"),
    ("steps", "/steps", "Steps"),
    ("experiences", "/experiences", "Experiences"),
    ("evals", "/evals", "Evals"),
)


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def num(value: Any, digits: int = 4) -> str:
    """A number for a table cell ('—' for none)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if abs(value) >= 10**digits:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return esc(value)


def href(path: str, **params: Any) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return esc(path + ("?" + urllib.parse.urlencode(kept) if kept else ""))


def link(path: str, text: str, **params: Any) -> str:
    return f'<a href="{href(path, **params)}">{esc(text)}</a>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, table_id: str = "") -> str:
    """A table of pre-rendered cells (a cell starting with '<td' is used as it is)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in row) + "</tr>" for row in rows
    )
    ident = f' id="{esc(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def td_num(value: Any, digits: int = 4, css: str = "") -> str:
    return f'<td class="num {css}">{num(value, digits)}</td>'


def tokens_html(tokens: Sequence[Token], *, has_text: bool) -> str:
    """Tokens as spans: prompt (p), trained response token (t: action mask 1), untrained (u).
    Without a tokenizer the spans show the ids, and the block says so."""
    spans = []
    for t in tokens:
        title = f"id {t.id}" + (f" · logprob {t.logprob:.3f}" if t.logprob is not None else "")
        spans.append(f'<span class="tok {t.kind}" title="{esc(title)}">{esc(t.text)}</span>')
    cls = "tokens" if has_text else "tokens ids"
    return f'<div class="{cls}">{"".join(spans)}</div>'


def page(
    title: str,
    body: str,
    *,
    run_name: str,
    active: str,
    stages: Sequence[str] = (),
    stage: str = "",
    poll: str = "",
    footer: str = "",
) -> str:
    """The frame every page shares; `poll` (a URL) makes view.js refresh the data-live parts."""
    nav = "".join(
        f'<a href="{href(path, stage=stage)}"{" class=active" if key == active else ""}>{esc(text)}</a>'
        for key, path, text in NAV
    )
    stage_links = "".join(
        f'<a href="{href("/" if active == "overview" else NAV_PATH.get(active, "/"), stage=s)}"'
        f"{' class=active' if s == stage else ''}>{esc(s)}</a>"
        for s in stages
    )
    stage_nav = f'<span class="stages">stage:{stage_links}</span>' if len(stages) > 1 else ""
    poll_attr = f' data-poll="{esc(poll)}" data-every="2000"' if poll else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · trinity view</title>"
        '<link rel="stylesheet" href="/static/view.css"></head>'
        f"<body{poll_attr}><header><span class=run>{esc(run_name)}</span>{nav}{stage_nav}</header>"
        f"<main><h1>{esc(title)}</h1>{body}</main>"
        f'<footer class="muted" style="padding:0 16px 16px">{footer}</footer>'
        '<script src="/static/view.js" defer></script></body></html>'
    )


NAV_PATH = {key: path for key, path, _ in NAV}


def error_page(status: int, message: str, *, hint: str = "") -> str:
    body = f'<div class="error"><p>{esc(message)}</p>{f"<p>{esc(hint)}</p>" if hint else ""}</div>'
    body += '<p><a href="/">back to the overview</a></p>'
    return page(f"{status}: {STATUS_TEXT.get(status, 'error')}", body, run_name="trinity view", active="")


STATUS_TEXT = {
    400: "bad request",
    401: "token required",
    403: "wrong token",
    404: "not found",
    500: "cannot read the run",
}
