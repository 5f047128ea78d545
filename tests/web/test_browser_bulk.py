"""The tasks list's bulk actions in a real browser (headless Chromium, Playwright),
through their confirmation, against a dashboard served by uvicorn on SQLite."""

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


def _statuses(db_url: str, ids: list[str]) -> list[Any]:
    with conveyor.connect_sync(db_url) as store:
        found = [store.get(i) for i in ids]
    return [None if t is None else t.status for t in found]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, list[str]]]:
    """The dashboard's address, its database and the ids of 6 failed tasks of
    queue ``jobs`` (two of them in a partition)."""
    chromium()
    db_url = f"sqlite:///{tmp_path_factory.mktemp('bulk') / 'conveyor.db'}"
    with conveyor.connect_sync(db_url) as sync:
        ids = [
            sync.submit("job", i, queue="jobs", max_attempts=1, partition="p" if i < 2 else None).id
            for i in range(6)
        ]
        while held := sync.claim("jobs", worker_id="w"):
            sync.fail(held[0].id, worker_id="w", error="boom", retryable=False)
        sync.submit("other", queue="jobs")
    with served_dashboard(db_url) as url:
        yield url, db_url, ids


@pytest.fixture
def page(served: tuple[str, str, list[str]]) -> Iterator[Any]:
    with browser_page(playwright_api) as tab:
        yield tab


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
