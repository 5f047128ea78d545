"""The dashboard in a real browser: headless Chromium from the system's packages,
driven by Playwright, against a dashboard served by uvicorn on a seeded SQLite store.

One server and one browser for the module. Set ``CONVEYOR_SCREENSHOTS=docs`` to
write the page screenshots docs/guide.md shows (otherwise they go to a temporary
directory)."""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _browser import ARGS, WAIT_MS, chromium, served_dashboard
from _seed import Seeded, seed

import conveyor
from conveyor import Status
from conveyor.store.base import TaskStore

# Under pytest-xdist (--dist loadgroup) the module's tests run in one process:
# one dashboard server and one Chromium serve them all.
pytestmark = pytest.mark.xdist_group("browser")

playwright_api = pytest.importorskip("playwright.sync_api")


@dataclass
class Served:
    url: str
    ids: Seeded
    db_url: str
    shots: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    chromium()
    db_url = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'conveyor.db'}"

    async def prepare() -> Seeded:
        async with conveyor.connect(db_url) as store:
            return await seed(store, history=True)

    ids = asyncio.run(prepare())
    target = os.environ.get("CONVEYOR_SCREENSHOTS")
    shots = Path(target) if target else tmp_path_factory.mktemp("shots")
    shots.mkdir(parents=True, exist_ok=True)
    with served_dashboard(db_url) as url:
        yield Served(url=url, ids=ids, db_url=db_url, shots=shots)


@pytest.fixture(scope="module")
def browser(served: Served) -> Iterator[Any]:
    with playwright_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=chromium(), args=ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    problems: list[str] = []
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    tab.on(
        "console",
        lambda msg: problems.append(f"console: {msg.text}") if msg.type == "error" else None,
    )
    try:
        yield tab
        assert problems == []
    finally:
        context.close()


def _task(db_url: str, task_id: str, group: str | None = None) -> conveyor.Task:
    with conveyor.connect_sync(db_url) as store:
        found = store.get(task_id, group=group)
    assert found is not None
    return found


def _on_store(db_url: str, work: Any) -> Any:
    """Run ``work(store)`` on a store of its own, in a thread: Playwright's sync API
    keeps an event loop running in this one."""
    out: list[Any] = []

    async def go() -> None:
        async with conveyor.connect(db_url) as store:
            out.append(await work(store))

    thread = threading.Thread(target=asyncio.run, args=(go(),))
    thread.start()
    thread.join(30)
    assert out, "the store work did not finish"
    return out[0]


PAGES = [
    ("queues", "/", "Queues"),
    ("groups", "/groups", "Consumer groups"),
    ("partitions", "/partitions?queue=orders", "Partitions of orders"),
    ("tasks", "/tasks", "Tasks"),
    ("workers", "/workers", "Workers"),
]


@pytest.mark.parametrize(("shot", "path", "heading"), PAGES, ids=[p[0] for p in PAGES])
def test_each_page_loads(page: Any, served: Served, shot: str, path: str, heading: str) -> None:
    page.goto(served.url + path)
    playwright_api.expect(page.locator("h1")).to_contain_text(heading)
    playwright_api.expect(page.locator("footer")).to_contain_text("refreshes every")
    # The task list is long: its first screen says enough.
    page.screenshot(path=str(served.shots / f"dashboard-{shot}.png"), full_page=shot != "tasks")


def test_the_throughput_plot_renders(page: Any, served: Served) -> None:
    page.goto(served.url + "/")
    plots = page.locator("svg.plot")
    playwright_api.expect(plots).to_have_count(4)
    # Everything is read in the page in one function: the live refresh swaps the
    # plot out every second, and a plot found by one call and measured by the next
    # may by then be a detached element with no box. Inside one function nothing
    # is swapped, so the plot found is the one measured.
    drawn = page.wait_for_function(
        """() => {
            const svg = document.querySelector('tr[data-queue="emails"] svg.plot');
            if (!svg || !svg.isConnected) return null;
            const r = svg.getBoundingClientRect();
            return {
                width: r.width,
                height: r.height,
                succeeded: svg.querySelectorAll('rect.bar.succeeded').length,
                failed: svg.querySelectorAll('rect.bar.failed').length,
                heights: [...svg.querySelectorAll('rect.bar')].map(b => b.height.baseVal.value),
            };
        }"""
    ).json_value()
    assert drawn["width"] > 100 and drawn["height"] > 20
    # An hour of finished work, a few failures among it: both kinds of bar are drawn.
    assert drawn["succeeded"] >= 50
    assert drawn["failed"] >= 10
    heights = drawn["heights"]
    assert heights and min(heights) >= 1 and max(heights) > 20


def test_a_click_is_not_lost_to_a_refresh(page: Any, served: Served) -> None:
    """A live refresh that lands between the press and the release of a click used
    to replace the link under the pointer, and the click never happened: the
    refresh now waits while a pointer is down."""
    ids = served.ids
    page.goto(served.url + "/tasks?status=failed")
    page.locator(f'tr[data-task="{ids.failed}"] a').first.hover()  # in view, pointer on it
    page.mouse.down()
    # A refresh comes back while the button is down (the page asks for one at once).
    with page.expect_response(lambda r: "/tasks" in r.url and r.request.method == "GET"):
        page.evaluate("document.body.dispatchEvent(new Event('conveyor-changed'))")
    page.wait_for_timeout(200)  # the swap, had it not waited, is done by now
    page.mouse.up()
    page.wait_for_url(re.compile(f"/tasks/{ids.failed}$"), timeout=5000)
    # And the refresh resumes once the pointer is up.
    playwright_api.expect(page.locator("pre.traceback")).to_contain_text("ConnectionError")


def test_list_to_detail_to_retry(page: Any, served: Served) -> None:
    ids = served.ids
    dialogs: list[str] = []

    def accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    page.goto(served.url + "/tasks?status=failed")
    row = page.locator(f'tr[data-task="{ids.failed}"]')
    row.locator("a").first.click()
    page.wait_for_url(re.compile(f"/tasks/{ids.failed}$"))
    playwright_api.expect(page.locator("pre.traceback")).to_contain_text("ConnectionError")
    page.screenshot(path=str(served.shots / "dashboard-task.png"), full_page=True)

    page.locator(".actions button", has_text="Retry").click()
    playwright_api.expect(page.locator("#flash .flash.ok")).to_contain_text("queued again")
    assert dialogs and "Retry task" in dialogs[0]
    # The live part reloads at once (no full page load) and shows the new status.
    playwright_api.expect(page.locator("h1 .status")).to_have_text("queued")
    assert _task(served.db_url, ids.failed).status is Status.QUEUED


def test_a_failing_action_shows_an_error_and_changes_nothing(page: Any, served: Served) -> None:
    ids = served.ids
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"{served.url}/tasks/{ids.cancelled}")
    retry = page.locator(".actions button", has_text="Retry")
    playwright_api.expect(retry).to_be_visible()

    # Meanwhile someone else retries the task and a worker finishes it.
    async def finish_elsewhere(store: TaskStore) -> None:
        await store.retry(ids.cancelled)
        [task] = await store.claim("emails", worker_id="elsewhere", limit=1)
        while task.id != ids.cancelled:  # other queued work comes first: finish it too
            await store.succeed(task.id, worker_id="elsewhere")
            [task] = await store.claim("emails", worker_id="elsewhere", limit=1)
        await store.succeed(task.id, worker_id="elsewhere", result="done")

    # Freeze the page's live refresh (htmx leaves the page as it is on a 204), so
    # the button stays the stale one a person would still be looking at.
    page.route(
        re.compile(r"/tasks/[^/?]+(\?.*)?$"),
        lambda route: (
            route.fulfill(status=204) if route.request.method == "GET" else route.continue_()
        ),
    )
    _on_store(served.db_url, finish_elsewhere)
    before = _task(served.db_url, ids.cancelled)
    retry.click()
    error = page.locator("#flash .flash.error")
    playwright_api.expect(error).to_contain_text("succeeded")
    playwright_api.expect(error).to_contain_text("only failed, cancelled, evicted or skipped")
    page.screenshot(path=str(served.shots / "dashboard-action-error.png"), full_page=False)
    after = _task(served.db_url, ids.cancelled)
    assert after == before and after.status is Status.SUCCEEDED


def test_pages_update_live_without_a_reload(page: Any, served: Served) -> None:
    page.goto(served.url + "/workers")
    page.evaluate("window.__marker = 'same page'")
    assert page.locator('[data-worker="live-worker"]').count() == 0

    async def claim(store: TaskStore) -> None:
        await store.submit("poke", queue="live")
        await store.claim("live", worker_id="live-worker")

    _on_store(served.db_url, claim)
    playwright_api.expect(page.locator('[data-worker="live-worker"]')).to_be_visible()
    assert page.evaluate("window.__marker") == "same page"


def test_tasks_are_newest_first_and_failed_ones_say_why(page: Any, served: Served) -> None:
    async def fail_one(store: TaskStore) -> tuple[str, str]:
        await store.submit("fragile", queue="browser-fail", max_attempts=1)
        [task] = await store.claim("browser-fail", worker_id="w")
        await store.fail(task.id, worker_id="w", error=OSError("disk full on /var"))
        oldest = (await store.list(limit=1)).items[0]
        return task.id, oldest.id

    failed, oldest = _on_store(served.db_url, fail_one)
    page.goto(served.url + "/tasks")
    rows = page.locator("table.tasks tbody tr")
    playwright_api.expect(rows.first).to_have_attribute("data-task", failed)  # the newest
    playwright_api.expect(page.locator("p.order")).to_contain_text("Newest first")
    error = rows.first.locator("td.error")
    playwright_api.expect(error).to_contain_text("OSError")
    playwright_api.expect(error).to_contain_text("disk full on /var")
    page.locator("a.flip").click()
    page.wait_for_url(re.compile(r"order=oldest"))
    playwright_api.expect(rows.first).to_have_attribute("data-task", oldest)
    playwright_api.expect(page.locator("p.order")).to_contain_text("Oldest first")
    # The filter form keeps the order chosen.
    page.locator("select[name=status]").select_option("succeeded")
    page.locator("form.controls button", has_text="Filter").click()
    page.wait_for_url(re.compile(r"status=succeeded"))
    assert "order=oldest" in page.url


def test_an_idle_worker_is_shown_live_until_it_stops(page: Any, served: Served) -> None:
    app = conveyor.App(served.db_url)
    worker = app.worker(
        "browser-idle", concurrency=4, worker_id="idle-worker", maintain_interval=None
    )

    async def serve() -> None:
        try:
            await worker.run()
        finally:
            await app.close()

    page.goto(served.url + "/workers")
    shown = page.locator('[data-worker="idle-worker"]')
    assert shown.count() == 0
    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    try:
        # It appears without a reload, idle, with what it consumes.
        playwright_api.expect(shown).to_contain_text("idle")
        playwright_api.expect(shown).to_contain_text("browser-idle")
        playwright_api.expect(shown).to_contain_text("runs 4 at once")
        playwright_api.expect(shown).to_have_attribute("data-held", "0")
    finally:
        worker.stop()
        thread.join(30)
    playwright_api.expect(shown).to_have_count(0)  # stopped: it leaves the list


def test_a_queues_dead_letter_queue_is_shown_with_its_settings(page: Any, served: Served) -> None:
    """A queue configured with a dead-letter queue shows it among its settings (a
    queue of its own: the seeded ones keep theirs)."""
    _on_store(served.db_url, lambda store: store.configure_queue("invoices", dead_letter="held"))
    page.goto(served.url + "/")
    row = page.locator("tr", has_text="invoices")
    playwright_api.expect(row.locator("td.settings")).to_contain_text("dead_letter")
    playwright_api.expect(row.locator("td.settings")).to_contain_text("held")


def test_pause_and_resume_a_queue_and_a_group(page: Any, served: Served) -> None:
    """The queues page pauses a queue behind a confirmation and shows it paused;
    the groups page pauses one group; claims follow (queues of their own: the
    seeded ones keep running)."""

    async def prepare(store: TaskStore) -> None:
        await store.submit("t", queue="held")
        await store.subscribe("held", "sink")

    _on_store(served.db_url, prepare)
    expect = playwright_api.expect
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(served.url + "/")
    row = page.locator('tr[data-queue="held"]')
    expect(row.locator(".badge.paused")).to_have_count(0)
    row.locator("button", has_text="Pause").click()
    expect(page.locator("#flash .flash.ok")).to_contain_text("held paused")
    expect(row.locator(".badge.paused")).to_be_visible()  # the live part reloaded
    assert _on_store(served.db_url, lambda s: s.claim("held", worker_id="w")) == []
    row.locator("button", has_text="Resume").click()
    expect(page.locator("#flash .flash.ok")).to_contain_text("held resumed")
    expect(row.locator(".badge.paused")).to_have_count(0)

    page.goto(served.url + "/groups")
    group = page.locator('tr[data-group="sink"]')
    group.locator("button", has_text="Pause").click()
    expect(page.locator("#flash .flash.ok")).to_contain_text("held for group sink paused")
    expect(group.locator(".badge.paused")).to_be_visible()
    assert _on_store(served.db_url, lambda s: s.claim("held", worker_id="w", group="sink")) == []
    # Queue mode is not paused by the group's pause.
    taken = _on_store(served.db_url, lambda s: s.claim("held", worker_id="w"))
    assert len(taken) == 1


def test_the_groups_page_shows_each_groups_health(page: Any, served: Served) -> None:
    """The seeded hour of history left two groups of emails behind: ``search``
    never claimed since (a red "stalled" badge), ``billing`` still claims
    (``lagging``); ``analytics`` is ok."""
    page.goto(served.url + "/groups")
    badges = {
        name: page.locator(f'tr[data-group="{name}"] span.health')
        for name in ("search", "billing", "analytics")
    }
    playwright_api.expect(badges["search"]).to_have_text("stalled")
    playwright_api.expect(badges["search"]).to_be_visible()
    playwright_api.expect(badges["billing"]).to_have_text("lagging")
    playwright_api.expect(badges["analytics"]).to_have_text("ok")
    shown = page.evaluate(
        """() => [...document.querySelectorAll('span.health')].map(b => [
            b.closest('tr').dataset.group,
            getComputedStyle(b).backgroundColor,
            b.closest('tr').querySelector('td[data-last-claim]').textContent.trim(),
        ])"""
    )
    colours = {group: colour for group, colour, _ in shown}
    assert colours["search"] == "rgb(251, 222, 221)", colours  # the red of a failure
    assert len(set(colours.values())) == 3, colours
    last_claims = {group: text for group, _, text in shown}
    assert last_claims["search"] == "–" and last_claims["billing"].endswith("ago"), last_claims
