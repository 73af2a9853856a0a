"""The evals page: scores per checkpoint (eval/results.jsonl) and each held-out question's answer
at two checkpoints side by side (eval/answers.jsonl, written by the explorer at every eval)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common.errors import InvalidArgument
from services.trainer.tally import read_lines
from services.view.html import esc, href, num, table, td_num
from services.view.pages_run import frame
from services.view.run_dir import Stage
from services.view.viewer import Viewer

ANSWERS_SHOWN = 200


def _scores(records: list[dict[str, Any]]) -> str:
    keys: list[str] = []
    for r in records:
        keys.extend(k for k in r.get("scores", {}) if "/mean@" in k and k not in keys)
    rows = [
        [
            esc(r.get("mode", "")),
            esc(r.get("explorer", "")),
            td_num(r.get("step")),
            td_num(r.get("model_version")),
            td_num(r.get("eval_s")),
            *(td_num(r.get("scores", {}).get(k), 4) for k in keys),
        ]
        for r in records
    ]
    return table(["mode", "explorer", "step", "model version", "eval s", *keys], rows, table_id="evals")


def checkpoints(answers: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The evals in the answers file, in order: (mode, explorer, step, model_version)."""
    seen: dict[tuple[Any, ...], None] = {}
    for a in answers:
        seen.setdefault((a.get("mode"), a.get("explorer"), a.get("step"), a.get("model_version")), None)
    return list(seen)


def _pick(params: Mapping[str, str], name: str, default: int, count: int) -> int:
    raw = params.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) >= count:
        raise InvalidArgument(f"{name} must be a checkpoint number 0..{count - 1}, got {raw!r}", field=name)
    return int(raw)


def _label(cp: tuple[Any, ...]) -> str:
    mode, explorer, step, version = cp
    return f"{mode} step {step} (v{version}, {explorer})"


def _compare(stage: Stage, answers: list[dict[str, Any]], params: Mapping[str, str]) -> str:
    cps = checkpoints(answers)
    a, b = _pick(params, "a", 0, len(cps)), _pick(params, "b", len(cps) - 1, len(cps))
    changed_only = params.get("changed", "") == "1"
    by_cp: dict[tuple[Any, ...], dict[tuple[Any, ...], dict[str, Any]]] = {cp: {} for cp in cps}
    for r in answers:
        cp = (r.get("mode"), r.get("explorer"), r.get("step"), r.get("model_version"))
        by_cp[cp][(r.get("taskset"), r.get("task_id"), r.get("run_id"))] = r
    before, after = by_cp[cps[a]], by_cp[cps[b]]
    keys = [k for k in after if k in before] + [k for k in before if k not in after]
    if changed_only:
        keys = [k for k in keys if (before.get(k) or {}).get("reward") != (after.get(k) or {}).get("reward")]
    options = "".join(f'<option value="{i}">{esc(i)}: {esc(_label(cp))}</option>' for i, cp in enumerate(cps))

    def select(name: str, current: int) -> str:
        return (
            f'<label>{name}<select name="{name}">'
            + options.replace(f'value="{current}">', f'value="{current}" selected>')
            + "</select></label>"
        )

    form = (
        f'<form class="filters" method="get" action="/evals"><input type="hidden" name="stage" value="{esc(stage.name)}">'
        f"{select('a', a)}{select('b', b)}<label>only changed rewards<select name=changed>"
        f'<option value="">no</option><option value="1"{" selected" if changed_only else ""}>yes</option></select></label>'
        '<button type="submit" id="compare">compare</button></form>'
    )
    rows = []
    for key in keys[:ANSWERS_SHOWN]:
        x, y = before.get(key) or {}, after.get(key) or {}
        first = y or x
        rows.append(
            [
                esc(key[1]),
                f'<div class="tokens">{esc(first.get("question", ""))}</div>',
                esc(first.get("truth", "")),
                f'<div class="tokens">{esc(x.get("answer", "—"))}</div>',
                td_num(x.get("reward"), 3),
                f'<div class="tokens">{esc(y.get("answer", "—"))}</div>',
                td_num(y.get("reward"), 3),
            ]
        )
    shown = f"{min(len(keys), ANSWERS_SHOWN)} of {len(keys)} samples" + (
        " whose reward changed" if changed_only else ""
    )
    headers = ["task", "question", "truth", f"answer at {a}", "reward", f"answer at {b}", "reward"]
    return form + f'<p id="answers-count">{shown}</p>' + table(headers, rows, table_id="answers")


def evals_page(v: Viewer, stage: Stage, params: Mapping[str, str]) -> str:
    records = [r for r in read_lines(str(stage.path / "eval" / "results.jsonl")) if r]
    answers = [r for r in read_lines(str(stage.path / "eval" / "answers.jsonl")) if r]
    body = "<h2>scores per checkpoint</h2>"
    body += (
        _scores(records) if records else f'<p class="muted">no eval records in {esc(stage.path / "eval")}</p>'
    )
    body += "<h2>held-out answers, before and after</h2>"
    if answers:
        body += _compare(stage, answers, params)
    else:
        body += (
            f'<p class="muted">no eval/answers.jsonl in {esc(stage.path)}: the run\'s explorer predates it '
            f"(it is written at every eval since). Scores only.</p>"
        )
    body += f'<p class="muted">{num(len(records))} evals · <a href="{href("/steps", stage=stage.name)}">steps</a></p>'
    return frame(v, f"{stage.name}: evals", body, active="evals", stage=stage.name)
