"""`make test-view`: `trinity view` in a real headless Chromium (Debian's package, driven by
Playwright; `playwright install` is never used). A fresh profile per session, no network
features. Screenshots go to tests/view/artifacts/ (git-ignored)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from services.view.server import ViewServer
from services.view.viewer import Viewer
from tests.integration.view_run import ViewRun

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = pathlib.Path(__file__).resolve().parent / "artifacts"
TRINITY = pathlib.Path(sys.executable).parent / "trinity"
TOY_STEPS = 6


@pytest.fixture(scope="session")
def artifacts() -> pathlib.Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def browser(tmp_path_factory) -> Iterator:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test-view` installs it (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 900},
        )
        yield context
        context.close()


@pytest.fixture
def page(browser) -> Iterator:
    tab = browser.new_page()
    tab.set_default_timeout(30_000)
    yield tab
    tab.close()


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory) -> pathlib.Path:
    """The toy demo as `trinity run` runs it, cut to one GRPO stage of TOY_STEPS steps with a
    `storage_type: sql` experience buffer (a queue's rows are gone once trained), services on free ports."""
    root = tmp_path_factory.mktemp("toy")
    sets = [
        "stages=[]",
        "name=viewtest",
        f"buffer.total_steps={TOY_STEPS}",
        "explorer.eval_interval=1000",
        "buffer.trainer_input.experience_buffer.storage_type=sql",
        *(f"services.{svc}.port=0" for svc in ("buffer", "synchronizer", "trainer", "explorer")),
    ]
    done = subprocess.run(
        [str(TRINITY), "run", *(a for s in sets for a in ("--set", s))],
        cwd=root,
        env={**os.environ, "TRINITY_CHECKPOINT_ROOT_DIR": str(root / "runs")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root / "runs" / "trinity-grpc" / "viewtest"


def serve(run_dir: pathlib.Path, index: pathlib.Path, refresh_s: float = 2.0) -> ViewServer:
    viewer = Viewer(str(run_dir), index_path=index)
    viewer.refresh()
    return ViewServer(viewer, port=0, refresh_s=refresh_s).start()


@pytest.fixture(scope="session")
def toy_view(toy_run, tmp_path_factory) -> Iterator[str]:
    server = serve(toy_run, tmp_path_factory.mktemp("toy-index") / "index.sqlite")
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def live_run(tmp_path_factory) -> Iterator[ViewRun]:
    """A run whose buffer server keeps serving: tests write more steps while the page is open."""
    run = ViewRun(tmp_path_factory.mktemp("live")).start()
    for step in (1, 2, 3):
        run.write_step(step)
    for step in (1, 2):
        run.train_step(step)
    yield run
    run.stop()


@pytest.fixture(scope="module")
def live_view(live_run, tmp_path_factory) -> Iterator[str]:
    server = serve(live_run.root, tmp_path_factory.mktemp("live-index") / "index.sqlite", refresh_s=0.3)
    yield server.url
    server.stop()
