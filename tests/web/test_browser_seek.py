"""A consumer group's seek in a real browser (headless Chromium, Playwright), from
the groups page through its confirmation, against a dashboard served by uvicorn
on SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _browser import browser_page, chromium, served_dashboard

import conveyor
from conveyor import Status

pytestmark = pytest.mark.xdist_group("browser")

playwright_api = pytest.importorskip("playwright.sync_api")


def _statuses(db_url: str, ids: list[str], group: str | None) -> list[Any]:
    with conveyor.connect_sync(db_url) as store:
        found = [store.get(i, group=group) for i in ids]
    return [None if t is None else t.status for t in found]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, list[str], str]]:
    """The dashboard's address, its database, the ids of 6 tasks of queue
    ``feed`` of which group ``replay`` finished the first 4, and the creation
    time of the third (ISO 8601)."""
    chromium()
    db_url = f"sqlite:///{tmp_path_factory.mktemp('seek') / 'conveyor.db'}"
    with conveyor.connect_sync(db_url) as sync:
        sync.subscribe("feed", "replay")
        tasks = [sync.submit("job", i, queue="feed", partition="p") for i in range(6)]
        for _ in range(4):
            [held] = sync.claim("feed", worker_id="w", group="replay")
            sync.succeed(held.id, worker_id="w", group="replay")
    with served_dashboard(db_url) as url:
        yield url, db_url, [t.id for t in tasks], tasks[2].created_at.isoformat()


@pytest.fixture
def page(served: tuple[str, str, list[str], str]) -> Iterator[Any]:
    with browser_page(playwright_api) as tab:
        yield tab


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
