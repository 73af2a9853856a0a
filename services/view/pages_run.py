"""The run's pages: overview (stages, services, progress, learning curve) and steps."""

from __future__ import annotations

import time
from typing import Any

from services.view import query
from services.view.html import esc, link, num, page, table, td_num
from services.view.run_dir import Stage
from services.view.svg import Series, line_chart
from services.view.viewer import Viewer


def frame(v: Viewer, title: str, body: str, *, active: str, stage: str, poll: str = "") -> str:
    synced = (
        f"index {esc(v.index.path)} · synced {time.strftime('%H:%M:%S', time.localtime(v.last_sync))}"
        if v.last_sync
        else f"index {esc(v.index.path)}"
    )
    return page(
        title,
        body,
        run_name=str(v.run.root),
        active=active,
        stages=[s.name for s in v.run.stages],
        stage=stage,
        poll=poll,
        footer=synced,
    )


# ---- overview ---------------------------------------------------------------------------------------
def _main_score(scores: dict[str, Any]) -> str:
    if not scores:
        return "—"
    key = next((k for k in scores if "/accuracy/mean@" in k), next(iter(scores)))
    return f'{num(scores[key], 3)} <span class="muted">{esc(key)}</span>'


def stages_fragment(v: Viewer) -> str:
    summary = {s.get("name"): s for s in v.run.summary().get("stages", []) if isinstance(s, dict)}
    rows = []
    for stage in v.run.stages:
        entry = summary.get(stage.name, {})
        exp = entry.get("experiences", {})
        live = stage.live_pids()
        status = ('<span class="live-dot"></span>live' if live else "") or entry.get("status", "—")
        rows.append(
            [
                link("/", stage.name, stage=stage.name),
                status,
                stage.cfg.mode if stage.cfg else f'<span class="muted">{esc(stage.cfg_error)}</span>',
                stage.cfg.algorithm.algorithm_type if stage.cfg else "—",
                td_num(entry.get("steps")),
                _main_score(entry.get("eval", {}).get("start", {})),
                _main_score(entry.get("eval", {}).get("end", {})),
                td_num(exp.get("written")),
                td_num(exp.get("trained")),
                td_num(sum(exp.get("dropped", {}).values()) if exp.get("dropped") else None),
                td_num(entry.get("wall_s")),
            ]
        )
    headers = ["stage", "status", "mode", "algorithm", "steps", "eval start", "eval end"]
    return table([*headers, "written", "trained", "dropped", "wall s"], rows, table_id="stages")


def services_fragment(v: Viewer, stage: Stage) -> str:
    rows = v.services(stage)
    if rows is None:
        return (
            '<p class="muted">the stage\'s services are not running (no live pid in logs/children.json)</p>'
        )
    return table(
        ["service", "address", "health", "version", "state", "stats"],
        (
            [
                esc(r.name),
                esc(r.address),
                esc(r.health),
                esc(r.version),
                esc(r.state),
                esc(" ".join(f"{k}={val:g}" for k, val in sorted(r.stats.items()))),
            ]
            for r in rows
        ),
        table_id="services",
    )


def _card(label: str, value: str, note: str = "", ident: str = "") -> str:
    attr = f' id="{esc(ident)}"' if ident else ""
    return f'<div class="card"><div class="muted">{esc(label)}</div><div class="big"{attr}>{value}</div><div class="muted">{note}</div></div>'


def progress_fragment(v: Viewer, stage: Stage) -> str:
    p = v.progress(stage)
    m = p.trainer_metrics
    if len(p.explorer_steps) == 1:
        explorers = str(next(iter(p.explorer_steps.values())))
    else:
        explorers = ", ".join(f"{esc(n)} {s}" for n, s in p.explorer_steps.items()) or "—"
    step_s = ", ".join(f"{num(s, 3)} s/step" for s in p.explorer_step_s.values())
    total = f" / {p.total_steps}" if p.total_steps else ""
    cards = [
        _card(
            "trainer step",
            f"{num(p.trainer_step)}{total}",
            f"{num(p.trainer_steps_per_min, 3)} steps/min",
            "trainer-step",
        ),
        _card("explorer step", explorers, step_s),
        _card("experiences indexed", num(p.rows), f"{num(p.rows_trained)} trained", "rows-indexed"),
        _card(
            "version lag",
            num(p.version_lag),
            f"newest experience from v{num(p.newest_version)}",
            "version-lag",
        ),
        _card("trainer tokens/s", num(m.get("perf/tokens_per_s"), 4), f"loss {num(m.get('actor/loss'), 3)}"),
        _card("rows/min", num(p.rows_per_min, 4), f"staleness {num(m.get('staleness/mean'), 3)} (last step)"),
    ]
    return f'<div class="cards">{"".join(cards)}</div>'


def charts_fragment(v: Viewer, stage: Stage) -> str:
    series = v.curve(stage)
    if isinstance(series, str):
        return f'<p class="muted">no learning curve: {esc(series)}</p>'
    reward = line_chart(
        "reward per step",
        [Series("mean rollout reward", series.reward)],
        x_label="explorer step",
        y_label="reward",
        chart_id="chart-reward",
    )
    evals = line_chart(
        "held-out",
        [Series(label, points) for label, points in series.evals.items()],
        x_label=series.minutes,
        y_label="held-out",
        y_range=(0.0, 1.0),
        chart_id="chart-eval",
    )
    return f'<div class="charts">{reward}{evals}</div>'


def overview_fragments(v: Viewer, stage: Stage) -> dict[str, str]:
    return {
        "stages": stages_fragment(v),
        "progress": progress_fragment(v, stage),
        "charts": charts_fragment(v, stage),
        "services": services_fragment(v, stage),
    }


def overview(v: Viewer, stage: Stage) -> str:
    parts = overview_fragments(v, stage)
    body = (
        f'<h2>stages</h2><div data-live="stages">{parts["stages"]}</div>'
        f'<h2>{esc(stage.name)}: progress</h2><div data-live="progress">{parts["progress"]}</div>'
        f'<h2>learning curve</h2><div data-live="charts">{parts["charts"]}</div>'
        f'<h2>services</h2><div data-live="services">{parts["services"]}</div>'
        f"<p>{link('/steps', 'experiences per step', stage=stage.name)} · "
        f"{link('/experiences', 'all experiences', stage=stage.name)} · "
        f"{link('/evals', 'eval results', stage=stage.name)}</p>"
    )
    poll = f"/api/overview?stage={stage.name}"
    return frame(v, f"run {v.run.root.name}", body, active="overview", stage=stage.name, poll=poll)


# ---- steps ---------------------------------------------------------------------------------------
def steps_fragment(v: Viewer, stage: Stage) -> str:
    with v.reader() as conn:
        steps = query.step_summary(conn, stage.name)
    if not steps:
        return '<p class="muted">no experiences of this stage in the index</p>'
    rows = [
        [
            link("/experiences", str(s["step"]), stage=stage.name, step=s["step"], sort="reward"),
            td_num(s["rows"]),
            td_num(s["reward_mean"]),
            td_num(s["reward_min"]),
            td_num(s["reward_max"]),
            td_num(s["flat_rows"]),
            f"{s['version_min']}–{s['version_max']}"
            if s["version_min"] != s["version_max"]
            else str(s["version_min"]),
            num(s["trained_min"])
            if s["trained_min"] == s["trained_max"]
            else f"{s['trained_min']}–{s['trained_max']}",
        ]
        for s in reversed(steps)
    ]
    headers = [
        "explorer step",
        "rows",
        "reward mean",
        "min",
        "max",
        "rows in flat groups",
        "model version",
        "trained at",
    ]
    return table(headers, rows, table_id="steps")


def steps_page(v: Viewer, stage: Stage) -> str:
    body = (
        '<p class="muted">Each explorer step\'s experiences; a step links to its rows, worst reward first.</p>'
        f'<div data-live="steps">{steps_fragment(v, stage)}</div>'
    )
    poll = f"/api/steps?stage={stage.name}"
    return frame(v, f"{stage.name}: steps", body, active="steps", stage=stage.name, poll=poll)
