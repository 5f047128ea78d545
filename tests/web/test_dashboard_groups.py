"""The groups page's health columns, driven in-process (ASGI) on both backends."""

from __future__ import annotations

import re

import httpx

from conveyor.store.base import TaskStore
from conveyor.web import dashboard


def client(store: TaskStore) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=dashboard(store)), base_url="http://dash"
    )


def _row(page: str, group: str) -> str:
    found = re.search(rf'<tr data-group="{group}">(.*?)</tr>', page, re.S)
    assert found, f"no row for group {group}"
    return found.group(1)


async def test_the_groups_page_shows_state_lag_oldest_age_and_last_claim(store: TaskStore) -> None:
    """Three tasks waiting some 1,000 s: ``stuck`` never claimed (stalled),
    ``slow`` just claimed one (lagging), ``idle`` of another queue has no work
    (ok), ``gone`` is unsubscribed (no badge)."""
    store.clock_offset = -1000
    for name in ("stuck", "slow"):
        await store.subscribe("orders", name)
    await store.subscribe("emails", "idle")
    await store.subscribe("emails", "gone")
    await store.unsubscribe("emails", "gone")
    for n in range(3):
        await store.submit("order", {"n": n}, queue="orders")
    store.clock_offset = 0
    assert len(await store.claim("orders", worker_id="w", group="slow")) == 1
    async with client(store) as http:
        page = (await http.get("/groups")).text
        relaxed = (await http.get("/groups?lagging_after=5000")).text
        bad = await http.get("/groups?lagging_after=soon")
        zero = await http.get("/groups?lagging_after=0")
    stuck, slow, idle, gone = (_row(page, g) for g in ("stuck", "slow", "idle", "gone"))
    assert '<span class="health stalled" data-state="stalled">stalled</span>' in stuck
    assert '<span class="health lagging" data-state="lagging">lagging</span>' in slow
    assert 'data-state="ok"' in idle and "health" not in gone
    assert '<td class="num">3</td>' in stuck  # lag: 3 queued
    assert re.search(r'data-oldest-age="1\d\d\d\.\d+">17 min<', stuck), stuck
    assert 'data-last-claim=""' in stuck and re.search(r"data-last-claim=\"\d{4}-", slow)
    assert " ago</td>" in slow
    assert 'data-oldest-age=""' in idle
    assert "longer than 1.4 h" in relaxed  # the threshold given is the one described
    assert re.findall(r'data-state="(\w+)"', relaxed) == ["ok", "ok", "ok"]
    assert bad.status_code == 400 and "lagging_after" in bad.text
    assert zero.status_code == 400 and "lagging_after" in zero.text
