"""`trinity view` in a real headless Chromium: a finished toy run's pages, the filters against the
buffer's own rows, a live run's page updating by itself, a screenshot of each view."""

from __future__ import annotations

import sqlite3

import pytest

from tests.integration.view_run import RUNS, STAGE, TASKS, expected_keys
from tests.view.conftest import TOY_STEPS


def shot(page, artifacts, name: str) -> None:
    page.screenshot(path=str(artifacts / f"{name}.png"), full_page=True)


def follow(page, target) -> None:
    """Click a link or button that loads another page and wait for that page (a count taken right
    after a bare click can still read the page being left)."""
    with page.expect_navigation():
        page.click(target) if isinstance(target, str) else target.click()


def table_keys(page) -> set:
    """(step, task, run) of the rows the experiences table shows."""
    rows = page.locator("#rows tbody tr")
    out = set()
    for i in range(rows.count()):
        cells = rows.nth(i).locator("td")
        out.add((int(cells.nth(1).inner_text()), cells.nth(5).inner_text(), int(cells.nth(6).inner_text())))
    return out


def test_a_finished_toy_run_shows_every_view(page, toy_view, toy_run, artifacts) -> None:
    buffer = sqlite3.connect(f"file:{toy_run / 'buffer' / 'experiences.sqlite'}?mode=ro", uri=True)
    written = buffer.execute("SELECT count(*) FROM items").fetchone()[0]
    buffer.close()
    assert written == TOY_STEPS * 32 * 8  # the demo's batch: 32 tasks x 8 rollouts

    page.goto(toy_view + "/")
    assert "complete" in page.locator("#stages").inner_text()
    assert page.locator("#trainer-step").inner_text() == f"{TOY_STEPS} / {TOY_STEPS}"
    assert page.locator("#rows-indexed").inner_text() == str(written)
    assert page.locator("#chart-reward polyline").count() == 1  # `trinity plot`'s reward per step
    shot(page, artifacts, "toy-overview")

    follow(page, "header >> text=Steps")
    assert page.locator("#steps tbody tr").count() == TOY_STEPS
    shot(page, artifacts, "toy-steps")

    follow(page, page.locator("#steps tbody tr").first.locator("a"))  # the last step, worst reward first
    assert page.locator("#total").get_attribute("data-total") == str(32 * 8)
    rewards = [float(t) for t in page.locator("#rows td.reward").all_inner_texts()]
    assert rewards == sorted(rewards)
    assert "decoded with the tokenizer builtin:tiny-arith" in page.inner_text("main")
    shot(page, artifacts, "toy-experiences")

    follow(page, page.locator("#rows a:text-is('group')").first)
    assert page.locator(".card.sample").count() == 8
    shot(page, artifacts, "toy-group")

    follow(page, page.locator(".card.sample a").first)
    assert page.locator("h1").inner_text().startswith("experience ")
    shot(page, artifacts, "toy-experience")

    follow(page, "header >> text=Evals")
    assert page.locator("#evals tbody tr").count() >= 2  # the bench evals at the stage's start and end
    # the explorer's eval/answers.jsonl: every held-out question at the first and the last eval
    assert page.inner_text("#answers-count") == "200 of 1000 samples"
    assert page.locator("#answers tbody tr").count() == 200
    shot(page, artifacts, "toy-evals")


@pytest.mark.parametrize(
    ("form", "filters"),
    [
        ({"step": "2"}, {"step": 2}),
        ({"reward_min": "0.5"}, {"reward_min": 0.5}),
        ({"reward_min": "0.2", "reward_max": "0.7"}, {"reward_min": 0.2, "reward_max": 0.7}),
        ({"flat": "only"}, {"flat": True}),
        ({"flat": "none", "step": "3"}, {"flat": False, "step": 3}),
        ({"task": "2", "reward_max": "0"}, {"task": "2", "reward_max": 0.0}),
    ],
)
def test_the_filter_form_returns_the_rows_of_the_buffer(page, live_view, live_run, form, filters) -> None:
    page.goto(f"{live_view}/experiences?stage={STAGE}")
    for name, value in {**form, "per_page": "500"}.items():
        if name == "flat":
            page.select_option("select[name=flat]", value)
        else:
            page.fill(f"input[name={name}]", value)
    follow(page, "#apply")
    expected = expected_keys(live_run.buffer_file(), **filters)
    assert expected
    assert table_keys(page) == expected
    assert page.locator("#total").get_attribute("data-total") == str(len(expected))


def test_a_live_runs_pages_update_by_themselves(page, live_view, live_run, artifacts) -> None:
    page.goto(f"{live_view}/?stage={STAGE}")
    before = int(page.locator("#rows-indexed").inner_text())
    live_run.write_step(before // (TASKS * RUNS) + 1)
    live_run.train_step(before // (TASKS * RUNS))
    after = before + TASKS * RUNS
    page.wait_for_function(
        f"document.querySelector('#rows-indexed').textContent === '{after}'", timeout=30_000
    )
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # no reload
    shot(page, artifacts, "live-overview")

    page.goto(f"{live_view}/experiences?stage={STAGE}")
    live_run.write_step(after // (TASKS * RUNS) + 1)
    page.wait_for_selector("#new-rows", timeout=30_000)
    assert f"{TASKS * RUNS} new rows match" in page.inner_text("#new-rows")
    follow(page, "#new-rows a")
    assert page.locator("#total").get_attribute("data-total") == str(after + TASKS * RUNS)


def test_bad_input_gets_a_page_not_a_traceback(page, live_view) -> None:
    response = page.goto(f"{live_view}/experiences?step=abc")
    assert response.status == 400
    assert "step must be a whole number, got 'abc'" in page.inner_text("main")
    response = page.goto(f"{live_view}/group?stage={STAGE}&id=missing")
    assert response.status == 404 and "no group 'missing'" in page.inner_text("main")
