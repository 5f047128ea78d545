"""A queue consumed by groups only (``configure_queue(queue_mode=False)``): the
dashboard, ``/metrics`` and ``conveyor stats`` leave its queue mode out, so no
backlog that never drains shows up anywhere and no task reads "queued" for ever."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conveyor.store.base import TaskStore

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from conveyor.web import dashboard  # noqa: E402  (needs the web extra)


async def _bus(store: TaskStore) -> list[str]:
    """Queue "bus" is groups-only with group "g", which finished 2 of its 3 tasks;
    queue "plain" keeps its queue mode. The ids of bus's tasks."""
    await store.configure_queue("bus", queue_mode=False)
    await store.subscribe("bus", "g")
    tasks = await store.submit_many([{"name": "event", "queue": "bus"} for _ in range(3)])
    for task in await store.claim("bus", worker_id="w", group="g", limit=2):
        await store.succeed(task.id, worker_id="w", group="g")
    await store.submit("job", queue="plain")
    return [t.id for t in tasks]


def _row(html: str, attr: str, value: str) -> str:
    match = re.search(rf'<tr {attr}="{re.escape(value)}"[^>]*>(.*?)</tr>', html, re.S)
    assert match, f"no row {attr}={value}"
    return match.group(0)


async def test_dashboard_and_metrics_leave_queue_mode_out(store: TaskStore) -> None:
    ids = await _bus(store)
    app = dashboard(store)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as http:
        queues = (await http.get("/")).text
        bus = _row(queues, "data-queue", "bus")
        assert 'data-queue-mode="off"' in bus and "groups only" in bus
        assert 'class="num queued' not in bus  # no queue-mode counts at all
        plain = _row(queues, "data-queue", "plain")
        assert 'data-queue-mode="off"' not in plain and 'class="num queued"' in plain

        metrics = (await http.get("/metrics")).text
        assert '{group="",queue="bus"' not in metrics  # no queue-mode series for bus
        assert 'conveyor_queue_lag{group="g",queue="bus"} 1.0' in metrics
        assert 'conveyor_queue_tasks{group="",queue="plain",status="queued"} 1.0' in metrics

        page = (await http.get(f"/tasks/{ids[0]}")).text
        heading = re.search(r"<h1>.*?</h1>", page, re.S)
        assert heading and "groups only" in heading.group(0)
        assert 'class="status queued"' not in heading.group(0)
        assert '<tr data-group="">' not in page  # no queue-mode row among the views
        assert '<tr data-group="g">' in page
        as_g = re.search(r"<h1>.*?</h1>", (await http.get(f"/tasks/{ids[0]}?group=g")).text, re.S)
        assert as_g and 'class="status succeeded"' in as_g.group(0)

        listing = (await http.get("/tasks")).text
        row = _row(listing, "data-task", ids[2])
        assert "groups only" in row and 'class="status queued"' not in row
        in_group = (await http.get("/tasks?group=g")).text
        assert 'class="status queued"' in _row(in_group, "data-task", ids[2])


async def test_conveyor_stats_leaves_queue_mode_out(store: TaskStore, store_url: str) -> None:
    await _bus(store)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "conveyor.cli", *args, "--url", store_url]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    as_json = cli("stats", "--json")
    assert as_json.returncode == 0, as_json.stderr
    reports = {r["queue"]: r for r in json.loads(as_json.stdout)}
    assert reports["bus"]["queue_mode"] is False and reports["bus"]["counts"] == {}
    assert reports["bus"]["groups"]["g"]["lag"] == 1
    assert reports["plain"]["queue_mode"] is True and reports["plain"]["counts"]["queued"] == 1
    table = cli("stats", "--queue", "bus")
    assert table.returncode == 0, table.stderr
    assert "groups only" in table.stdout and "group g" in table.stdout
    assert "queue mode " not in table.stdout.replace("no queue mode", "")
