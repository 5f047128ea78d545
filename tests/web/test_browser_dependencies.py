"""A task's dependency graph and a batch's page in a real browser (headless
Chromium, Playwright), against a dashboard served on a seeded SQLite store."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _browser import browser_page, chromium, served_dashboard

import conveyor

pytestmark = pytest.mark.xdist_group("browser")

playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """A root that succeeded, 20 children (one failed), a fan-in child cancelled
    for it, and a closed batch of three tasks, two finished; served."""
    chromium()
    db_url = f"sqlite:///{tmp_path_factory.mktemp('deps') / 'conveyor.db'}"

    async def seed() -> dict[str, Any]:
        async with conveyor.connect(db_url) as store:
            root = await store.submit("root", queue="q")
            kids = await store.submit_many(
                [{"name": "kid", "queue": "q", "after": [root], "max_attempts": 1}] * 20
            )
            last = await store.submit("join", queue="q", after=kids)
            [held] = await store.claim("q", worker_id="w")
            await store.succeed(held.id, worker_id="w")
            [first] = await store.claim("q", worker_id="w")
            await store.fail(first.id, worker_id="w", error="boom")
            async with store.batch("report", queue="b") as batch:
                parts = [await batch.submit("part") for _ in range(3)]
            for task in await store.claim("b", worker_id="w", limit=2):
                await store.succeed(task.id, worker_id="w")
            return {
                "root": root.id,
                "failed": first.id,
                "last": last.id,
                "batch": batch.id,
                "callback": batch.callback.id,
                "parts": [p.id for p in parts],
            }

    ids = asyncio.run(seed())
    with served_dashboard(db_url) as url:
        yield url, ids


def _shot(tab: Any, name: str) -> None:
    target = os.environ.get("CONVEYOR_SCREENSHOTS")
    if target:
        tab.screenshot(path=str(Path(target) / name), full_page=True)


def test_task_page_draws_its_dependency_graph(seeded: tuple[str, dict[str, Any]]) -> None:
    url, ids = seeded
    with browser_page(playwright_api) as tab:
        tab.goto(f"{url}/tasks/{ids['last']}")
        svg = tab.locator("svg.dag")
        assert svg.get_attribute("data-tasks") == "22"
        assert svg.get_attribute("data-edges") == "40"
        # The focused fan-in, the root and 11 of the children are boxes; the other
        # nine children are one "+9 more" box.
        assert tab.locator("svg.dag a.node").count() == 13
        assert tab.locator("svg.dag g.more").get_attribute("data-hidden") == "9"
        join = tab.locator(f'svg.dag a.node[data-id="{ids["last"]}"]')
        assert join.get_attribute("data-status") == "cancelled"
        root = tab.locator(f'svg.dag a.node[data-id="{ids["root"]}"]')
        assert root.get_attribute("data-status") == "succeeded"
        # The failed child is drawn red; clicking a box opens that task's page.
        failed = tab.locator(f'svg.dag a.node[data-id="{ids["failed"]}"]')
        assert failed.get_attribute("data-status") == "failed"
        assert tab.locator(".error-envelope").inner_text().count("ParentFailed") == 1
        _shot(tab, "dashboard-dependencies.png")
        root.click()
        tab.wait_for_url(f"**/tasks/{ids['root']}")
        assert tab.locator("svg.dag").get_attribute("data-tasks") == "22"


def test_batch_page_shows_progress(seeded: tuple[str, dict[str, Any]]) -> None:
    url, ids = seeded
    with browser_page(playwright_api) as tab:
        tab.goto(f"{url}/tasks/{ids['callback']}")
        tab.locator(".batch-link a").click()
        tab.wait_for_url(f"**/batches/{ids['batch']}")
        done = tab.locator(".batch-done")
        assert (done.get_attribute("data-finished"), done.get_attribute("data-total")) == ("2", "3")
        assert tab.locator(".batch-state").inner_text() == "closed"
        assert tab.locator('.batch-counts td[data-status="succeeded"]').inner_text() == "2"
        assert tab.locator('.batch-counts td[data-status="queued"]').inner_text() == "1"
        assert "waiting" in tab.locator("h1 ~ dl .batch-callback + *").inner_text()
        _shot(tab, "dashboard-batch.png")
        tab.locator(".batch-callback").click()
        tab.wait_for_url(f"**/tasks/{ids['callback']}")
        # The callback's graph: the three tasks of the batch above it.
        assert tab.locator("svg.dag").get_attribute("data-tasks") == "4"


def test_unknown_batch_is_404(seeded: tuple[str, dict[str, Any]]) -> None:
    url, _ = seeded
    with browser_page(playwright_api) as tab:
        response = tab.goto(f"{url}/batches/01ARZ3NDEKTSV4RRFFQ69G5FAV")
        assert response is not None and response.status == 404
