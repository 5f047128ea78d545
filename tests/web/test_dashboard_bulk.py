"""The dashboard's bulk actions on the tasks list, driven in-process (ASGI) on
both backends: shown only with actions allowed, a preview that counts and writes
nothing, then the action; the same guards as the other actions."""

from __future__ import annotations

from typing import Any

import httpx

from conveyor import Status
from conveyor.store.base import TaskStore
from conveyor.web import dashboard

HX = {"HX-Request": "true"}
FILTER = {"queue": "jobs", "status": "failed", "name": "", "partition": "", "group": ""}


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")


async def failed_tasks(store: TaskStore, n: int) -> list[str]:
    ids = [(await store.submit("job", i, queue="jobs", max_attempts=1)).id for i in range(n)]
    while held := await store.claim("jobs", worker_id="w"):
        await store.fail(held[0].id, worker_id="w", error="boom", retryable=False)
    return ids


async def test_the_buttons_follow_the_filter_and_the_mode(store: TaskStore) -> None:
    await failed_tasks(store, 2)
    async with client(dashboard(store)) as http:
        page = (await http.get("/tasks?queue=jobs")).text
        assert "matching…" not in page and 'id="bulk-confirm"' not in page
    async with client(dashboard(store, allow_actions=True)) as http:
        anywhere = (await http.get("/tasks")).text
        assert "filter by a queue" in anywhere and 'data-bulk="retry"' not in anywhere
        failed = (await http.get("/tasks?queue=jobs&status=failed")).text
        assert 'data-bulk="retry"' in failed and 'data-bulk="purge"' in failed
        assert 'data-bulk="cancel"' not in failed
        queued = (await http.get("/tasks?queue=jobs&status=queued")).text
        assert 'data-bulk="cancel"' in queued and 'data-bulk="retry"' not in queued
        every = (await http.get("/tasks?queue=jobs")).text
        for action in ("retry", "cancel", "purge"):
            assert f'data-bulk="{action}"' in every


async def test_preview_then_act(store: TaskStore) -> None:
    ids = await failed_tasks(store, 3)
    async with client(dashboard(store, allow_actions=True)) as http:
        preview = await http.post(
            "/actions/preview", data={**FILTER, "action": "retry"}, headers=HX
        )
        assert preview.status_code == 200
        assert "Retry <b data-count>3</b> task(s) of queue <b>jobs</b> (queue mode)" in preview.text
        assert 'hx-post="/actions/retry_where"' in preview.text
        assert [(await store.get(i)).status for i in ids] == [Status.FAILED] * 3  # type: ignore[union-attr]

        done = await http.post("/actions/retry_where", data=FILTER, headers=HX)
        assert done.status_code == 200 and "3 task(s) of queue jobs queued again" in done.text
        assert done.headers.get("HX-Trigger") == "conveyor-changed"
        assert [(await store.get(i)).status for i in ids] == [Status.QUEUED] * 3  # type: ignore[union-attr]

        again = await http.post("/actions/retry_where", data=FILTER, headers=HX)
        assert "nothing changed" in again.text and "flash error" in again.text
        none = await http.post("/actions/preview", data={**FILTER, "action": "retry"}, headers=HX)
        assert "nothing to retry" in none.text

        queued = {**FILTER, "status": "queued"}
        cancelled = await http.post("/actions/cancel_where", data=queued, headers=HX)
        assert "3 task(s) of queue jobs cancelled" in cancelled.text
        purge = await http.post(
            "/actions/preview", data={**FILTER, "status": "", "action": "purge"}, headers=HX
        )
        assert "Purge <b data-count>3</b>" in purge.text
        purged = await http.post("/actions/purge_where", data={**FILTER, "status": ""}, headers=HX)
        assert "3 task(s) of queue jobs purged" in purged.text
        assert [await store.get(i) for i in ids] == [None] * 3


async def test_guards_and_bad_input(store: TaskStore) -> None:
    ids = await failed_tasks(store, 2)
    async with client(dashboard(store)) as http:
        refused = await http.post("/actions/retry_where", data=FILTER, headers=HX)
        assert refused.status_code == 403
        preview = await http.post(
            "/actions/preview", data={**FILTER, "action": "retry"}, headers=HX
        )
        assert preview.status_code == 403
    async with client(dashboard(store, allow_actions=True)) as http:
        plain = await http.post("/actions/retry_where", data=FILTER)
        assert plain.status_code == 400 and "HX-Request" in plain.text
        wrong = await http.post("/actions/cancel_where", data=FILTER, headers=HX)
        assert "cancel_where failed" in wrong.text and "status" in wrong.text
        unknown = await http.post(
            "/actions/preview", data={**FILTER, "action": "rerun"}, headers=HX
        )
        assert "preview failed" in unknown.text and "action" in unknown.text
        no_queue = await http.post("/actions/purge_where", data={**FILTER, "queue": ""}, headers=HX)
        assert "purge_where failed" in no_queue.text and "queue" in no_queue.text
    assert [(await store.get(i)).status for i in ids] == [Status.FAILED] * 2  # type: ignore[union-attr]
