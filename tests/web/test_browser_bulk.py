"""The tasks list's bulk actions in a real browser (headless Chromium, Playwright),
through their confirmation, against a dashboard served by uvicorn on SQLite."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import conveyor
from conveyor import Status
from conveyor.web import dashboard

CHROMIUM = os.environ.get("CONVEYOR_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
WAIT_MS = 10_000
pytestmark = pytest.mark.xdist_group("browser")

playwright_api = pytest.importorskip("playwright.sync_api")


def _chromium() -> str:
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the browser tests need Chromium in CI: apt-get install chromium")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    return path


def _statuses(db_url: str, ids: list[str]) -> list[Any]:
    with conveyor.connect_sync(db_url) as store:
        found = [store.get(i) for i in ids]
    return [None if t is None else t.status for t in found]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, list[str]]]:
    """The dashboard's address, its database and the ids of 6 failed tasks of
    queue ``jobs`` (two of them in a partition)."""
    import uvicorn

    _chromium()
    db_url = f"sqlite:///{tmp_path_factory.mktemp('bulk') / 'conveyor.db'}"
    with conveyor.connect_sync(db_url) as sync:
        ids = [
            sync.submit("job", i, queue="jobs", max_attempts=1, partition="p" if i < 2 else None).id
            for i in range(6)
        ]
        while held := sync.claim("jobs", worker_id="w"):
            sync.fail(held[0].id, worker_id="w", error="boom", retryable=False)
        sync.submit("other", queue="jobs")
    store = conveyor.connect(db_url)
    app = dashboard(store, allow_actions=True, refresh=1.0)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )

    async def main() -> None:
        try:
            await server.serve()
        finally:
            await store.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", db_url, ids
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture
def page(served: tuple[str, str, list[str]]) -> Iterator[Any]:
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), args=ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 800})
            tab.set_default_timeout(WAIT_MS)
            problems: list[str] = []
            tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            yield tab
            assert problems == []
        finally:
            browser.close()


def test_retry_the_filtered_tasks_through_the_confirmation(
    page: Any, served: tuple[str, str, list[str]], tmp_path: Path
) -> None:
    url, db_url, ids = served
    expect = playwright_api.expect
    page.goto(f"{url}/tasks?queue=jobs&status=failed")
    expect(page.locator('button[data-bulk="cancel"]')).to_have_count(0)  # none is active

    # Purge first, then think better of it: nothing is deleted.
    page.locator('button[data-bulk="purge"]').click()
    confirm = page.locator("#bulk-confirm .confirm")
    expect(confirm).to_contain_text("Purge 6 task(s) of queue jobs (queue mode), status failed?")
    confirm.locator("[data-dismiss]").click()
    expect(confirm).to_have_count(0)
    assert _statuses(db_url, ids) == [Status.FAILED] * 6

    page.locator('button[data-bulk="retry"]').click()
    expect(confirm).to_contain_text("Retry 6 task(s)")
    # Nothing is written before the confirmation.
    assert _statuses(db_url, ids) == [Status.FAILED] * 6
    page.screenshot(path=str(tmp_path / "bulk-confirm.png"))
    confirm.locator("[data-confirm]").click()
    expect(page.locator("#bulk-confirm .flash.ok")).to_contain_text(
        "6 task(s) of queue jobs queued again"
    )
    # The live list reloads at once: no failed task is left in it.
    expect(page.locator('tr[data-status="failed"]')).to_have_count(0)
    assert _statuses(db_url, ids) == [Status.QUEUED] * 6
