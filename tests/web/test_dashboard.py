"""The dashboard's pages, actions and access rules, driven in-process (ASGI) on both
backends. The browser tests (test_browser.py) cover what only a browser sees."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from _seed import Seeded, seed
from sqlalchemy.engine import make_url

import conveyor
from conveyor import ConfigurationError, Status
from conveyor.cli import run as cli_run
from conveyor.store.base import TaskStore
from conveyor.web import dashboard
from conveyor.web.serve import check_bind

HX = {"HX-Request": "true"}


def client(app: Any, prefix: str = "") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url=f"http://dash{prefix}"
    )


@pytest.fixture
async def seeded(store: TaskStore) -> AsyncIterator[tuple[TaskStore, Seeded]]:
    yield store, await seed(store)


async def test_every_page_renders_the_seeded_store(seeded: tuple[TaskStore, Seeded]) -> None:
    store, ids = seeded
    async with client(dashboard(store)) as http:
        page = (await http.get("/")).text
        for queue in ("emails", "orders", "reports"):
            assert f'data-queue="{queue}"' in page
        assert page.count('<svg class="plot"') == 4  # all queues + one per queue
        assert 'data-succeeded="1" data-failed="1"' in page  # emails: one of each
        assert "read-only" in page

        groups = (await http.get("/groups")).text
        assert 'data-group="analytics"' in groups
        assert "Unsubscribe" not in groups  # read-only

        parts = (await http.get("/partitions?queue=orders")).text
        assert "leased by" in parts and "worker-b" in parts
        assert "waiting for its retry" in parts

        # A task waiting for its parent (the seeded running one), on the listing too.
        await store.submit("later", queue="emails", after=[ids.running])
        tasks = (await http.get("/tasks")).text
        for status in Status:
            if status is not Status.SKIPPED:  # a group's status only (seek)
                assert f'data-status="{status.value}"' in tasks
        await store.subscribe("orders", "late")
        await store.seek("orders", "late", to="end")
        skipped = (await http.get("/tasks?queue=orders&group=late")).text
        assert 'data-status="skipped"' in skipped and 'class="status skipped"' in skipped

        failed = (await http.get(f"/tasks/{ids.failed}")).text
        assert "smtp.example.com refused the connection" in failed
        assert "Traceback" in failed and "ConnectionError" in failed
        assert "group analytics" in failed  # per-group delivery state
        assert "Retry" not in failed  # read-only

        parent = (await http.get(f"/tasks/{ids.parent}")).text
        assert ids.child in parent
        child = (await http.get(f"/tasks/{ids.child}")).text
        assert ids.parent in child

        running = (await http.get(f"/tasks/{ids.running}")).text
        assert "rendering" in running and "<progress" in running

        workers = (await http.get("/workers")).text
        assert 'data-worker="worker-a"' in workers and ids.running in workers
        assert 'data-worker="worker-b"' in workers

        missing = await http.get("/tasks/01NOSUCHTASK0000000000000")
        assert missing.status_code == 404 and "no task" in missing.text
        bad = await http.get("/tasks?status=exploded")
        assert bad.status_code == 400 and "status" in bad.text


async def test_search_by_id_or_key_and_keyset_pages(seeded: tuple[TaskStore, Seeded]) -> None:
    store, ids = seeded
    await store.submit_many([{"name": "bulk", "queue": "bulk"} for _ in range(120)])
    async with client(dashboard(store)) as http:
        by_key = await http.get("/tasks?q=k-d")
        assert by_key.status_code == 303 and by_key.headers["location"].endswith(ids.queued)
        by_id = await http.get(f"/tasks?q={ids.failed}")
        assert by_id.headers["location"].endswith(ids.failed)
        nothing = await http.get("/tasks?q=nope")
        assert nothing.status_code == 200 and "no task has the id or key nope" in nothing.text

        seen: list[list[str]] = []
        url: str | None = "/tasks?queue=bulk"
        links: list[str] = []
        while url is not None:
            html = (await http.get(url)).text
            seen.append(re.findall(r'data-task="([^"]+)"', html))
            links.append(url)
            found = re.search(r'rel="next" href="([^"]+)"', html)
            url = found.group(1).replace("&amp;", "&") if found else None
        assert [len(p) for p in seen] == [50, 50, 20]
        assert len({i for p in seen for i in p}) == 120
        # Previous from the last page goes back to the second, then to the first.
        html = (await http.get(links[2])).text
        back = re.search(r'rel="prev" href="([^"]+)"', html)
        assert back is not None
        html = (await http.get(back.group(1).replace("&amp;", "&"))).text
        assert re.findall(r'data-task="([^"]+)"', html) == seen[1]
        back = re.search(r'rel="prev" href="([^"]+)"', html)
        assert back is not None
        html = (await http.get(back.group(1).replace("&amp;", "&"))).text
        assert re.findall(r'data-task="([^"]+)"', html) == seen[0]
        assert 'rel="prev"' not in html


async def test_tasks_newest_first_with_errors_and_an_oldest_first_switch(
    seeded: tuple[TaskStore, Seeded],
) -> None:
    store, ids = seeded
    made = await store.submit_many([{"name": "bulk", "queue": "bulk"} for _ in range(60)])
    in_order = [t.id for t in made]

    def rows(html: str) -> list[str]:
        return re.findall(r'data-task="([^"]+)"', html)

    def link(html: str, pattern: str) -> str:
        found = re.search(pattern, html)
        assert found is not None, pattern
        return found.group(1).replace("&amp;", "&")

    async with client(dashboard(store)) as http:
        first = (await http.get("/tasks?queue=bulk")).text
        assert rows(first) == in_order[:9:-1] and "Newest first" in first
        second = (await http.get(link(first, r'rel="next" href="([^"]+)"'))).text
        assert rows(second) == in_order[9::-1]
        oldest = (await http.get(link(first, r'class="flip" href="([^"]+)"'))).text
        assert rows(oldest) == in_order[:50] and "Oldest first" in oldest
        after = (await http.get(link(oldest, r'rel="next" href="([^"]+)"'))).text
        assert rows(after) == in_order[50:]  # the next page keeps the order
        back = link(oldest, r'class="flip" href="([^"]+)"')
        assert "order=" not in back and rows((await http.get(back)).text) == in_order[:9:-1]

        # A failed task says why in its row; nothing else fills the column.
        everything = (await http.get("/tasks?queue=emails")).text
        assert "<th>error</th>" in everything
        failed_row = everything.split(f'data-task="{ids.failed}"', 1)[1].split("</tr>", 1)[0]
        assert "ConnectionError" in failed_row and "refused the connection" in failed_row
        queued_row = everything.split(f'data-task="{ids.queued}"', 1)[1].split("</tr>", 1)[0]
        assert 'class="error"></td>' in queued_row
        assert "<th>error</th>" not in first  # no failed task on the page


async def test_actions_change_the_store_only_when_allowed(
    seeded: tuple[TaskStore, Seeded],
) -> None:
    store, ids = seeded
    async with client(dashboard(store)) as http:
        refused = await http.post("/actions/retry", data={"task_id": ids.failed}, headers=HX)
        assert refused.status_code == 403 and "--allow-actions" in refused.text
    assert (await store.get(ids.failed)).status is Status.FAILED  # type: ignore[union-attr]

    async with client(dashboard(store, allow_actions=True)) as http:
        page = (await http.get(f"/tasks/{ids.failed}")).text
        assert "hx-confirm" in page and "Retry" in page
        # Without the htmx header (a cross-site form could not add it): refused.
        plain = await http.post("/actions/retry", data={"task_id": ids.failed})
        assert plain.status_code == 400
        assert (await store.get(ids.failed)).status is Status.FAILED  # type: ignore[union-attr]

        ok = await http.post("/actions/retry", data={"task_id": ids.failed}, headers=HX)
        assert "queued again" in ok.text and ok.headers["HX-Trigger"] == "conveyor-changed"
        assert (await store.get(ids.failed)).status is Status.QUEUED  # type: ignore[union-attr]

        # A failing action says why and changes nothing.
        before = await store.get(ids.succeeded)
        no = await http.post("/actions/retry", data={"task_id": ids.succeeded}, headers=HX)
        assert 'class="flash error"' in no.text and "succeeded" in no.text
        assert "HX-Trigger" not in no.headers
        assert await store.get(ids.succeeded) == before
        gone = await http.post("/actions/cancel", data={"task_id": "nope"}, headers=HX)
        assert "no task nope" in gone.text

        done = await http.post("/actions/cancel", data={"task_id": ids.queued}, headers=HX)
        assert "cancelled" in done.text
        assert (await store.get(ids.queued)).status is Status.CANCELLED  # type: ignore[union-attr]
        again = await http.post("/actions/cancel", data={"task_id": ids.queued}, headers=HX)
        assert "cannot be cancelled" in again.text

        sub = await http.post(
            "/actions/subscribe", data={"queue": "emails", "group": "audit"}, headers=HX
        )
        assert "subscribed" in sub.text
        assert ("emails", "audit") in {(g.queue, g.name) for g in await store.groups()}
        unsub = await http.post(
            "/actions/unsubscribe", data={"queue": "emails", "group": "audit"}, headers=HX
        )
        assert "unsubscribed" in unsub.text
        bad = await http.post(
            "/actions/subscribe", data={"queue": "emails", "group": ""}, headers=HX
        )
        assert 'class="flash error"' in bad.text and "group" in bad.text


async def test_mounted_under_a_prefix_links_stay_inside(store: TaskStore) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    task = await store.submit("t", queue="q")
    outer = Starlette(routes=[Mount("/conveyor", dashboard(store))])
    async with client(outer) as http:
        html = (await http.get("/conveyor/tasks")).text
        assert f'href="/conveyor/tasks/{task.id}"' in html
        assert 'src="/conveyor/static/htmx.min.js"' in html
        js = await http.get("/conveyor/static/htmx.min.js")
        assert js.status_code == 200 and "htmx" in js.text[:200]


async def test_credentials_are_required_when_configured(store: TaskStore) -> None:
    basic = dashboard(store, auth="admin:s3cret")
    async with client(basic) as http:
        denied = await http.get("/")
        assert denied.status_code == 401 and "Basic" in denied.headers["www-authenticate"]
        wrong = base64.b64encode(b"admin:nope").decode()
        assert (await http.get("/", headers={"Authorization": f"Basic {wrong}"})).status_code == 401
        good = base64.b64encode(b"admin:s3cret").decode()
        assert (await http.get("/", headers={"Authorization": f"Basic {good}"})).status_code == 200

    tokened = dashboard(store, token="t0ken")
    async with client(tokened) as http:
        assert (await http.get("/metrics")).status_code == 401
        ok = await http.get("/metrics", headers={"Authorization": "Bearer t0ken"})
        assert ok.status_code == 200
        first = await http.get("/?token=t0ken")
        assert first.status_code == 200 and "conveyor_token" in first.headers["set-cookie"]
        assert (await http.get("/groups")).status_code == 200  # the cookie carries it

    with pytest.raises(ConfigurationError, match="USER:PASSWORD"):
        dashboard(store, auth="admin")
    with pytest.raises(ConfigurationError, match="connect_sync"):
        dashboard(conveyor.SyncStore(store))  # type: ignore[arg-type]


def test_binding_beyond_loopback_needs_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    check_bind("127.0.0.1", None, None)
    check_bind("::1", None, None)
    check_bind("0.0.0.0", "a:b", None)
    check_bind("10.1.2.3", None, "tok")
    with pytest.raises(ConfigurationError, match="without authentication"):
        check_bind("0.0.0.0", None, None)
    assert cli_run(["dashboard", "--host", "0.0.0.0"]) == 2
    assert "refusing to serve the dashboard on 0.0.0.0" in capsys.readouterr().err


async def test_metrics_page_reports_the_rollups(seeded: tuple[TaskStore, Seeded]) -> None:
    store, _ = seeded
    async with client(dashboard(store)) as http:
        response = await http.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'conveyor_queue_tasks{group="",queue="emails",status="running"} 1.0' in text
    assert 'conveyor_queue_lag{group="analytics",queue="emails"}' in text
    assert 'conveyor_queue_oldest_claimable_age_seconds{group="",queue="emails"}' in text
    assert (
        'conveyor_tasks_finished_total{group="",name="nightly",queue="reports",status="evicted"}'
        " 1.0" in text
    )


async def test_the_header_names_the_database(store_url: str, backend: str) -> None:
    # On Postgres with a password (the test server trusts, so it is ignored) that
    # must not reach the page.
    url = store_url
    if backend == "postgres":
        url = make_url(store_url).set(password="s3cret-pw").render_as_string(False)
    parsed = make_url(url)
    shown = parsed.set(drivername=parsed.get_backend_name()).render_as_string(True)
    async with conveyor.connect(url) as store, client(dashboard(store)) as http:
        pages = [(await http.get(path)).text for path in ("/", "/tasks", "/workers")]
    for page in pages:
        assert re.search(rf'<span class="database"[^>]*>{re.escape(shown)}</span>', page)
        assert "s3cret-pw" not in page


async def test_pause_and_resume_actions(store: TaskStore) -> None:
    await store.submit("t", queue="jobs")
    await store.subscribe("jobs", "g")
    async with client(dashboard(store, allow_actions=True)) as http:
        page = (await http.get("/")).text
        assert "Pause" in page and 'data-paused="yes"' not in page
        done = await http.post("/actions/pause", data={"queue": "jobs"}, headers=HX)
        assert "jobs paused" in done.text and done.headers["HX-Trigger"] == "conveyor-changed"
        assert (await store.stats("jobs"))[0].paused is True
        page = (await http.get("/")).text
        assert 'data-paused="yes"' in page and "Resume" in page
        again = await http.post("/actions/pause", data={"queue": "jobs"}, headers=HX)
        assert "was paused already" in again.text and "HX-Trigger" not in again.headers
        grp = await http.post("/actions/pause", data={"queue": "jobs", "group": "g"}, headers=HX)
        assert "jobs for group g paused" in grp.text
        groups = (await http.get("/groups")).text
        assert 'class="badge paused"' in groups
        await http.post("/actions/resume", data={"queue": "jobs"}, headers=HX)
        assert (await store.stats("jobs"))[0].paused is False
        missing = await http.post(
            "/actions/pause", data={"queue": "jobs", "group": "nobody"}, headers=HX
        )
        assert "pause failed" in missing.text and "nobody" in missing.text
        metrics_text = (await http.get("/metrics")).text
        assert 'conveyor_queue_paused{group="",queue="jobs"} 0.0' in metrics_text
        assert 'conveyor_queue_paused{group="g",queue="jobs"} 1.0' in metrics_text
    async with client(dashboard(store)) as http:  # read-only: no buttons, no action
        page = (await http.get("/")).text
        assert "Pause" not in page
        refused = await http.post("/actions/pause", data={"queue": "jobs"}, headers=HX)
        assert refused.status_code == 403
    assert (await store.stats("jobs"))[0].groups["g"].paused is True


async def test_the_queues_page_shows_debounce_and_max_depth(store: TaskStore) -> None:
    await store.configure_queue("jobs", debounce=5, max_depth=100)
    async with client(dashboard(store)) as http:
        page = (await http.get("/")).text
    row = page[page.index('data-queue="jobs"') :]
    row = row[: row.index("</tr>")]
    assert "<dt>debounce</dt><dd>5.0 s</dd>" in row
    assert "<dt>max_depth</dt><dd>100</dd>" in row
