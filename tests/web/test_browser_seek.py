"""A consumer group's seek in a real browser (headless Chromium, Playwright), from
the groups page through its confirmation, against a dashboard served by uvicorn
on SQLite."""

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


def _statuses(db_url: str, ids: list[str], group: str | None) -> list[Any]:
    with conveyor.connect_sync(db_url) as store:
        found = [store.get(i, group=group) for i in ids]
    return [None if t is None else t.status for t in found]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, list[str], str]]:
    """The dashboard's address, its database, the ids of 6 tasks of queue
    ``feed`` of which group ``replay`` finished the first 4, and the creation
    time of the third (ISO 8601)."""
    import uvicorn

    _chromium()
    db_url = f"sqlite:///{tmp_path_factory.mktemp('seek') / 'conveyor.db'}"
    with conveyor.connect_sync(db_url) as sync:
        sync.subscribe("feed", "replay")
        tasks = [sync.submit("job", i, queue="feed", partition="p") for i in range(6)]
        for _ in range(4):
            [held] = sync.claim("feed", worker_id="w", group="replay")
            sync.succeed(held.id, worker_id="w", group="replay")
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
        yield (
            f"http://127.0.0.1:{port}",
            db_url,
            [t.id for t in tasks],
            tasks[2].created_at.isoformat(),
        )
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture
def page(served: tuple[str, str, list[str], str]) -> Iterator[Any]:
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


def test_seek_a_group_through_the_confirmation(
    page: Any, served: tuple[str, str, list[str], str], tmp_path: Path
) -> None:
    url, db_url, ids, point = served
    expect = playwright_api.expect
    before = [Status.SUCCEEDED] * 4 + [Status.QUEUED] * 2
    page.goto(f"{url}/groups")
    form = page.locator("form.seek")
    form.locator('input[name="queue"]').fill("feed")
    form.locator('input[name="group"]').fill("replay")
    form.locator('input[name="to"]').fill(point)

    # Ask, then think better of it: nothing is written.
    form.locator("[data-seek-preview]").click()
    confirm = page.locator("#seek-confirm .confirm")
    expect(confirm).to_contain_text("Seek group replay of queue feed")
    expect(confirm.locator("[data-requeued]")).to_have_text("2")
    expect(confirm.locator("[data-skipped]")).to_have_text("0")
    confirm.locator("[data-dismiss]").click()
    expect(confirm).to_have_count(0)
    assert _statuses(db_url, ids, "replay") == before

    form.locator("[data-seek-preview]").click()
    expect(confirm.locator("[data-requeued]")).to_have_text("2")
    assert _statuses(db_url, ids, "replay") == before
    page.screenshot(path=str(tmp_path / "seek-confirm.png"))
    confirm.locator("[data-confirm]").click()
    expect(page.locator("#seek-confirm .flash.ok")).to_contain_text(
        "2 task(s) queued again, 0 skipped, 0 left running"
    )
    assert _statuses(db_url, ids, "replay") == [Status.SUCCEEDED] * 2 + [Status.QUEUED] * 4
    # Queue mode is untouched.
    assert _statuses(db_url, ids, None) == [Status.QUEUED] * 6

    # A point without a zone is refused, with the reason.
    form.locator('input[name="to"]').fill("2026-12-01T00:00")
    form.locator("[data-seek-preview]").click()
    expect(page.locator("#seek-confirm .flash.error")).to_contain_text("needs a time zone")
