"""`trinity view` without a browser: the index and every page over a run whose experiences went
through the real buffer server (tests/integration/view_run.py), the filters checked against the
buffer's own SQLite rows, the query plans, bad input, the token, and the CLI as a subprocess."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import urllib.request

import pytest

from services.common.errors import ConfigError, FailedPrecondition, InvalidArgument
from services.view import query
from services.view.app import COOKIE, App
from services.view.server import ViewServer, check_binding
from services.view.viewer import Viewer
from tests.conftest import TRINITY
from tests.integration.view_run import RUNS, STAGE, TASKS, ViewRun, expected_keys


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    built = ViewRun(tmp_path_factory.mktemp("view")).start()
    for step in (1, 2, 3, 4):
        built.write_step(step)
    for step in (1, 2, 3):
        built.train_step(step)
    yield built
    built.stop()


@pytest.fixture(scope="module")
def viewer(run, tmp_path_factory):
    v = Viewer(str(run.root), index_path=tmp_path_factory.mktemp("index") / "index.sqlite")
    v.refresh()
    return v


@pytest.fixture(scope="module")
def app(viewer):
    return App(viewer)


def get_json(app: App, target: str) -> dict:
    response = app.handle(target, {})
    assert response.status == 200, response.body[:500]
    return json.loads(response.body)


def keys_of(app: App, params: str) -> set:
    data = get_json(app, f"/api/experiences?per_page=500&{params}")
    assert data["total"] == len(data["rows"])
    return {(r["step"], r["task_id"], r["run_id"]) for r in data["rows"]}


def test_index_holds_every_written_row_with_its_trainer_step(viewer, run) -> None:
    with viewer.reader() as conn:
        rows = conn.execute("SELECT step, task_id, run_id, reward, trained_step, flat FROM rows").fetchall()
    assert len(rows) == 4 * TASKS * RUNS == len(run.written)
    for step, task, run_id, reward, trained, flat in rows:
        assert trained == (step if step <= 3 else None)  # step 4 is written, not trained yet
        assert flat == (task == "0")
        assert math.isclose(
            reward,
            run.written[
                [(e.batch_id, e.task_id, e.run_id) for e in run.written].index((step, task, run_id))
            ].reward,
        )


@pytest.mark.parametrize(
    ("params", "filters"),
    [
        ("step=2", {"step": 2}),
        ("reward_min=0.5", {"reward_min": 0.5}),
        ("reward_min=0.2&reward_max=0.7", {"reward_min": 0.2, "reward_max": 0.7}),
        ("flat=only", {"flat": True}),
        ("flat=none&step=3", {"flat": False, "step": 3}),
        ("task=1", {"task": "1"}),
        ("task=2&reward_max=0&sort=reward", {"task": "2", "reward_max": 0.0}),
    ],
)
def test_filters_return_the_rows_the_buffer_holds(app, run, params, filters) -> None:
    expected = expected_keys(run.buffer_file(), **filters)
    assert expected  # every case finds something
    assert keys_of(app, params) == expected


def test_pages_are_ordered_and_split(app) -> None:
    worst = get_json(app, "/api/experiences?sort=reward&per_page=5")
    rewards = [r["reward"] for r in worst["rows"]]
    assert rewards == sorted(rewards) and rewards[0] == 0.0
    assert worst["pages"] == math.ceil(4 * TASKS * RUNS / 5)
    ids = [r["id"] for p in (1, 2, 3) for r in get_json(app, f"/api/experiences?per_page=4&page={p}")["rows"]]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 12  # newest first, no row twice


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"step": "2"},
        {"reward_min": "0.5"},
        {"sort": "reward"},
        {"flat": "only"},
        {"flat": "none", "sort": "-reward"},
        {"task": "1"},
        {"task": "1", "flat": "only", "reward_min": "0", "sort": "oldest"},
    ],
)
def test_page_and_count_queries_use_an_index(viewer, params) -> None:
    filters = query.Filters.parse(params, STAGE)
    with viewer.reader() as conn:
        for sql, args in (query.page_sql(filters), query.count_sql(filters)):
            plan = query.explain(conn, sql, args)
            assert any("USING INDEX" in line or "USING COVERING INDEX" in line for line in plan), plan
            assert not any(line.startswith("SCAN rows") for line in plan), plan


def test_group_page_shows_its_samples_with_grpo_advantages(app) -> None:
    response = app.handle("/group?id=explorer/2/tasks/1", {})
    body = response.body.decode()
    assert response.status == 200
    assert body.count('class="card sample"') == RUNS
    # rewards 0, 1/3, 2/3, 1: mean 1/2, unbiased std sqrt((1/4 + 1/36 + 1/36 + 1/4) / 3) = 0.43033;
    # advantages (r - 1/2) / 0.43033 = -1.162, -0.387, 0.387, 1.162
    shown = re.findall(r"advantage <span [^>]*>([-0-9.]+)</span>", body)
    assert shown == ["-1.16", "-0.387", "0.387", "1.16"]
    assert 'class="tok u"' in body  # run 3's <eos> has action mask 0


def test_flat_group_rows_are_marked_dropped(app) -> None:
    body = app.handle("/experiences?task=0&step=2", {}).body.decode()
    assert body.count(">dropped</td>") == RUNS


def test_experience_page_decodes_tokens_with_the_runs_tokenizer(app, viewer) -> None:
    with viewer.reader() as conn:
        row_id = conn.execute(
            "SELECT id FROM rows WHERE step = 3 AND task_id = '2' AND run_id = 1"
        ).fetchone()[0]
    body = app.handle(f"/experience?id={row_id}", {}).body.decode()
    assert "decoded with the tokenizer builtin:tiny-arith" in body
    prompt = re.search(r"<h2>prompt</h2><div class=\"tokens\">(.*?)</div>", body).group(1)
    assert re.sub(r"<[^>]+>", "", prompt) == "3+2="
    assert "staleness 0" in body  # generated by v2, trained at step 3 on v2


def test_overview_and_steps_pages(app) -> None:
    overview = get_json(app, f"/api/overview?stage={STAGE}")
    assert overview["progress"]["rows"] == 48 and overview["progress"]["rows_trained"] == 36
    assert overview["progress"]["trainer_step"] == 3 and overview["progress"]["version_lag"] == 0
    assert "<polyline" not in overview["fragments"]["charts"]  # no TensorBoard files: said, not drawn
    assert "no learning curve" in overview["fragments"]["charts"]
    steps = app.handle("/steps", {}).body.decode()
    assert steps.count("<tr>") == 1 + 4
    assert app.handle("/evals", {}).status == 200


def test_evals_compare_each_held_out_answer_between_checkpoints(run, app) -> None:
    evals = run.root / "eval"
    evals.mkdir(exist_ok=True)
    answers = []
    for version, replies in (
        (0, {"a": ("3", 0.0), "b": ("9", 1.0)}),
        (3, {"a": ("4", 1.0), "b": ("9", 1.0)}),
    ):
        for task, (reply, reward) in replies.items():
            head = {"explorer": "bench", "mode": "bench", "step": version, "model_version": version}
            answers.append(
                {
                    **head,
                    "taskset": "heldout",
                    "task_id": task,
                    "run_id": 0,
                    "question": f"q-{task}",
                    "truth": "4" if task == "a" else "9",
                    "answer": reply,
                    "reward": reward,
                }
            )
    (evals / "answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    (evals / "results.jsonl").write_text(
        "".join(
            json.dumps(
                {"mode": "bench", "step": v, "model_version": v, "scores": {"eval/heldout/reward/mean@1": s}}
            )
            + "\n"
            for v, s in ((0, 0.5), (3, 1.0))
        )
    )
    body = app.handle("/evals", {}).body.decode()
    assert body.count("<tr>") == 1 + 2 + 1 + 2  # scores: header + 2 evals; answers: header + 2 tasks
    assert "2 of 2 samples" in body and "answer at 0" in body and "answer at 1" in body
    changed = app.handle("/evals?a=0&b=1&changed=1", {}).body.decode()
    assert "1 of 1 samples whose reward changed" in changed and "q-a" in changed and "q-b" not in changed
    bad = app.handle("/evals?a=7", {})
    assert bad.status == 400 and "a must be a checkpoint number 0..1, got &#x27;7&#x27;" in bad.body.decode()


@pytest.mark.parametrize(
    ("target", "status", "says"),
    [
        ("/experiences?step=abc", 400, "step must be a whole number, got &#x27;abc&#x27;"),
        ("/experiences?reward_min=x", 400, "reward_min must be a number"),
        ("/experiences?reward_min=2&reward_max=1", 400, "is above reward_max"),
        ("/experiences?page=0", 400, "page must be in 1..inf"),
        ("/experiences?sort=best", 400, "sort must be one of"),
        ("/experiences?stage=nope", 404, "no stage &#x27;nope&#x27;"),
        ("/group?id=nope", 404, "no group"),
        ("/experience?id=xyz", 400, "id must be a whole number"),
        ("/experience?id=999999", 404, "no experience with id 999999"),
        ("/nope", 404, "no page /nope"),
        ("/api/experiences?step=abc", 400, "step must be a whole number"),
    ],
)
def test_bad_input_gets_a_clear_page(app, target, status, says) -> None:
    response = app.handle(target, {})
    body = response.body.decode()
    assert response.status == status
    assert says in body
    assert "Traceback" not in body


def test_a_corrupt_index_gets_a_clear_page(tmp_path, run) -> None:
    v = Viewer(str(run.root), index_path=tmp_path / "index.sqlite")
    v.refresh()
    (tmp_path / "index.sqlite").write_bytes(b"not a database" * 100)
    for name in ("index.sqlite-wal", "index.sqlite-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    response = App(v).handle("/experiences", {})
    assert response.status == 500
    assert "is not a database" in response.body.decode() and "Traceback" not in response.body.decode()


def test_a_corrupt_buffer_file_is_reported_not_raised(tmp_path) -> None:
    stage = tmp_path / "run"
    (stage / "buffer").mkdir(parents=True)
    (stage / "buffer" / "experiences.sqlite").write_bytes(b"garbage" * 1000)
    v = Viewer(str(stage), index_path=tmp_path / "index.sqlite")
    assert v.refresh().rows == 0
    assert App(v).handle("/experiences", {}).status == 200


def test_unknown_run_dir_is_refused(tmp_path) -> None:
    with pytest.raises(InvalidArgument, match="is not a directory"):
        Viewer(str(tmp_path / "missing"))
    with pytest.raises(InvalidArgument, match="is not a run directory"):
        Viewer(str(tmp_path))
    with pytest.raises(ConfigError, match="config file not found"):
        Viewer(config=str(tmp_path / "missing.yaml"))


def test_an_index_that_cannot_be_written_is_refused(run, tmp_path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(FailedPrecondition, match="give --index PATH somewhere writable"):
        Viewer(str(run.root), index_path=tmp_path / "file" / "index.sqlite")


def test_live_run_updates_the_overview(run, tmp_path) -> None:
    v = Viewer(str(run.root), index_path=tmp_path / "index.sqlite")
    v.refresh()
    app = App(v)
    before = get_json(app, "/api/overview")["fragments"]["progress"]
    run.write_step(5)
    run.train_step(4)
    v.refresh()
    after = get_json(app, "/api/overview")
    assert after["progress"]["rows"] == 5 * TASKS * RUNS and after["progress"]["trainer_step"] == 4
    assert after["fragments"]["progress"] != before
    new = get_json(app, "/api/new?seen=48")["fragments"]["new"]
    assert "12 new rows match" in new


def test_a_live_stage_shows_its_services_health(run, viewer) -> None:
    from services.common.version import __version__

    stage = viewer.run.stages[0]
    assert "not running" in get_json(App(viewer), "/api/overview")["fragments"]["services"]
    run.record_children()
    try:
        rows = {r.name: r for r in viewer.services(stage)}
    finally:
        (run.root / "logs" / "children.json").unlink()
    assert rows["buffer"].health == "SERVING" and rows["buffer"].version == __version__
    assert rows["trainer"].health != "SERVING"  # its port is free: nothing listens


def test_config_names_the_same_run_and_its_services(run, tmp_path) -> None:
    v = Viewer(config=str(run.config), index_path=tmp_path / "index.sqlite")
    v.refresh()
    assert v.run.root == run.root and [s.name for s in v.run.stages] == [STAGE]
    assert get_json(App(v), "/api/experiences")["total"] == len(run.written)
    # named by a config, the services are probed without a children.json: a deployed run
    assert "SERVING" in get_json(App(v), "/api/overview")["fragments"]["services"]


def test_fifo_rows_seen_before_the_trainer_consumed_them_stay(tmp_path) -> None:
    import asyncio

    from services.buffer.client import BufferClient

    fifo = ViewRun(tmp_path, kind="queue").start()
    try:
        fifo.write_step(1)
        v = Viewer(str(fifo.root), index_path=tmp_path / "index.sqlite")
        v.refresh()

        async def consume() -> None:
            client = await BufferClient.connect(fifo.address, timeout=30)
            batch = await client.read("experiences", TASKS * RUNS, max_wait=5)
            await client.ack(batch.lease_id)
            await client.close()

        asyncio.run(consume())
        conn = sqlite3.connect(fifo.buffer_file().absolute().as_uri() + "?mode=ro", uri=True)
        assert conn.execute("SELECT count(*) FROM items").fetchone()[0] == 0  # acked fifo rows are deleted
        conn.close()
        v.refresh()
        assert get_json(App(v), "/api/experiences")["total"] == TASKS * RUNS
    finally:
        fifo.stop()


def test_a_token_guards_every_page(viewer) -> None:
    with pytest.raises(InvalidArgument, match="give a token"):
        check_binding("0.0.0.0", None)
    check_binding("0.0.0.0", "s3cret")
    check_binding("localhost", None)
    app = App(viewer, token="s3cret")
    assert app.handle("/", {}).status == 401
    assert app.handle("/", {"Authorization": "Bearer wrong"}).status == 403
    assert app.handle("/api/experiences", {"Authorization": "Bearer s3cret"}).status == 200
    redirect = app.handle("/steps?stage=demo&token=s3cret", {})
    assert redirect.status == 303 and redirect.headers["Location"] == "/steps?stage=demo"
    assert redirect.headers["Set-Cookie"].startswith(f"{COOKIE}=s3cret;")
    assert app.handle("/steps", {"Cookie": f"{COOKIE}=s3cret"}).status == 200


def test_view_server_serves_over_http(viewer) -> None:
    with ViewServer(viewer, port=0, refresh_s=0.2) as server:
        with urllib.request.urlopen(server.url + "/static/view.js", timeout=10) as r:
            assert r.status == 200 and b"data-poll" in r.read()
        with urllib.request.urlopen(server.url + "/experiences?flat=only", timeout=30) as r:
            assert r.status == 200 and b'id="rows"' in r.read()


def test_cli_serves_the_run_until_sigterm(run, tmp_path) -> None:
    proc = subprocess.Popen(
        [str(TRINITY), "view", str(run.root), "--port", "0", "--index", str(tmp_path / "i.sqlite")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = ""
        while "open http" not in line:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
        url = re.search(r"open (http://\S+)", line).group(1)
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_cli_refuses_a_missing_run_dir(tmp_path) -> None:
    done = subprocess.run(
        [str(TRINITY), "view", str(tmp_path / "missing")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "is not a directory" in done.stderr and "Traceback" not in done.stderr
