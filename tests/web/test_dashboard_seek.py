"""The dashboard's seek of a consumer group, on the groups page, driven
in-process (ASGI) on both backends: shown only with actions allowed, a preview
that counts and writes nothing, then the seek; bad points refused."""

from __future__ import annotations

from typing import Any

import httpx

from conveyor import Status
from conveyor.models import Task
from conveyor.store.base import TaskStore
from conveyor.web import dashboard

HX = {"HX-Request": "true"}


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")


async def history(store: TaskStore) -> list[Task]:
    """Six tasks of queue ``feed``; group ``g`` finished the first four."""
    await store.subscribe("feed", "g")
    await store.subscribe("feed", "h")
    tasks = [await store.submit("job", i, queue="feed") for i in range(6)]
    for _ in range(4):
        [held] = await store.claim("feed", worker_id="w", group="g")
        await store.succeed(held.id, worker_id="w", group="g")
    return tasks


async def statuses(store: TaskStore, tasks: list[Task], group: str) -> list[Status]:
    return [(await store.get(t.id, group=group)).status for t in tasks]  # type: ignore[union-attr]


async def test_the_seek_form_is_there_only_with_actions(store: TaskStore) -> None:
    await history(store)
    async with client(dashboard(store)) as http:
        page = (await http.get("/groups")).text
        assert "seek_preview" not in page and 'id="seek-confirm"' not in page
        refused = await http.post(
            "/actions/seek", data={"queue": "feed", "group": "g", "to": "end"}, headers=HX
        )
        assert refused.status_code == 403
    async with client(dashboard(store, allow_actions=True)) as http:
        page = (await http.get("/groups")).text
        assert 'hx-post="/actions/seek_preview"' in page and 'id="seek-confirm"' in page
        assert '<option value="g">' in page and '<option value="h">' in page
        end = {"queue": "feed", "group": "g", "to": "end"}
        no_htmx = await http.post("/actions/seek", data=end)
        assert no_htmx.status_code == 400
    [report] = await store.stats("feed")
    assert report.groups["g"].counts["skipped"] == 0  # nothing written


async def test_preview_then_seek(store: TaskStore) -> None:
    tasks = await history(store)
    point = tasks[2].created_at.isoformat()
    form = {"queue": "feed", "group": "g", "to": point, "partition": ""}
    async with client(dashboard(store, allow_actions=True)) as http:
        preview = await http.post("/actions/seek_preview", data=form, headers=HX)
        assert preview.status_code == 200
        text = preview.text
        assert "Seek group <b>g</b> of queue <b>feed</b>" in text
        assert "<b data-requeued>2</b>" in text and "<b data-skipped>0</b>" in text
        assert 'hx-post="/actions/seek"' in text
        assert await statuses(store, tasks, "g") == [Status.SUCCEEDED] * 4 + [Status.QUEUED] * 2

        done = await http.post("/actions/seek", data=form, headers=HX)
        assert done.status_code == 200
        assert "2 task(s) queued again, 0 skipped, 0 left running" in done.text
        assert done.headers.get("HX-Trigger") == "conveyor-changed"
        assert await statuses(store, tasks, "g") == [Status.SUCCEEDED] * 2 + [Status.QUEUED] * 4
        assert await statuses(store, tasks, "h") == [Status.QUEUED] * 6

        end = {**form, "group": "h", "to": "end"}
        skipped = await http.post("/actions/seek", data=end, headers=HX)
        assert "0 task(s) queued again, 6 skipped" in skipped.text
        assert await statuses(store, tasks, "h") == [Status.SKIPPED] * 6
        again = await http.post("/actions/seek", data=end, headers=HX)
        assert "0 skipped" in again.text and "flash error" in again.text  # nothing changed


async def test_bad_points_and_unknown_groups_are_refused(store: TaskStore) -> None:
    tasks = await history(store)
    async with client(dashboard(store, allow_actions=True)) as http:
        for to, said in (
            ("2026-12-01T00:00", "needs a time zone"),
            ("soon", "must be start, end or an ISO 8601 time"),
        ):
            for action in ("seek_preview", "seek"):
                bad = await http.post(
                    f"/actions/{action}",
                    data={"queue": "feed", "group": "g", "to": to},
                    headers=HX,
                )
                assert 'class="flash error"' in bad.text and said in bad.text, (to, action)
        missing = await http.post(
            "/actions/seek_preview", data={"queue": "feed", "group": "x", "to": "end"}, headers=HX
        )
        assert 'class="flash error"' in missing.text and "not found" in missing.text
    assert await statuses(store, tasks, "g") == [Status.SUCCEEDED] * 4 + [Status.QUEUED] * 2
