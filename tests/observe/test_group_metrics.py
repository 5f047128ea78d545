"""The consumer groups' health as Prometheus metrics: what the dashboard's
``/metrics`` and a worker's metrics endpoint serve, on both backends."""

from __future__ import annotations

from typing import Any

import pytest

import conveyor
from conveyor import metrics
from conveyor.store.base import TaskStore

pytest.importorskip("prometheus_client")


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


async def _behind(store: TaskStore) -> None:
    """Three tasks waiting some 1,000 s on ``orders``: ``stuck`` never claimed,
    ``slow`` just claimed one; ``idle`` of ``emails`` has no work; ``gone`` is
    unsubscribed."""
    store.clock_offset = -1000
    await store.subscribe("orders", "stuck")
    await store.subscribe("orders", "slow")
    await store.subscribe("emails", "idle")
    await store.subscribe("emails", "gone")
    await store.unsubscribe("emails", "gone")
    for n in range(3):
        await store.submit("order", {"n": n}, queue="orders")
    store.clock_offset = 0
    assert len(await store.claim("orders", worker_id="w", group="slow")) == 1


def _check(found: dict[Any, float]) -> None:
    for group, state in (("stuck", "stalled"), ("slow", "lagging")):
        assert found[_key("conveyor_group_lag", queue="orders", group=group)] == 3
        age = found[_key("conveyor_group_oldest_age_seconds", queue="orders", group=group)]
        assert 1000 <= age < 1100
        for name in ("ok", "lagging", "stalled"):
            one = _key("conveyor_group_state", queue="orders", group=group, state=name)
            assert found[one] == (1 if name == state else 0), (group, name)
        stalled = found[_key("conveyor_group_stalled", queue="orders", group=group)]
        assert stalled == (1 if state == "stalled" else 0)
    idle = {"queue": "emails", "group": "idle"}
    assert found[_key("conveyor_group_lag", **idle)] == 0
    assert found[_key("conveyor_group_state", **idle, state="ok")] == 1
    assert found[_key("conveyor_group_stalled", **idle)] == 0
    # No claimable task, no claim yet: those series are absent, not zero.
    assert _key("conveyor_group_oldest_age_seconds", **idle) not in found
    last = "conveyor_group_last_claim_timestamp_seconds"
    assert _key(last, queue="orders", group="stuck") not in found
    assert found[_key(last, queue="orders", group="slow")] > 1.7e9
    # An unsubscribed group has no series at all.
    assert not [k for k in found if ("group", "gone") in k[1]]


async def test_the_store_metrics_report_each_groups_health(store: TaskStore) -> None:
    await _behind(store)
    _check(_samples((await metrics.store_exposition(store)).decode()))


async def test_a_workers_metrics_endpoint_reports_them_too(
    store: TaskStore, store_url: str
) -> None:
    """The reader behind ``conveyor worker --metrics-port`` (a blocking store of its
    own, in a thread as the endpoint runs it)."""
    import asyncio

    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    await _behind(store)
    reader = metrics._StoreReader(store_url)

    def scrape() -> str:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(metrics._Families(reader.families))
        try:
            return bytes(generate_latest(registry)).decode()
        finally:
            reader.close()

    found = _samples(await asyncio.to_thread(scrape))
    assert found[_key("conveyor_store_up")] == 1
    _check(found)


def test_no_group_no_series(tmp_path: Any) -> None:
    with conveyor.connect_sync(f"sqlite:///{tmp_path / 'c.db'}") as store:
        store.submit("t", queue="q")
        text = metrics.render(
            metrics.store_families(
                metrics.StoreSnapshot(
                    stats=store.stats(), totals=store.finished_totals(), groups=store.groups()
                )
            )
        ).decode()
    assert "conveyor_group_lag{" not in text and "conveyor_queue_lag{" in text
