"""Flow control on both backends (``configure_queue(q, concurrency=, key_concurrency=,
rate=, key_rate=, fair=)``, ``submit(..., concurrency_key=...)``): the limits hold
across claims of separate stores, an expired lease frees its slot, fair claims
take turns across keys, bus-mode groups are limited apart, and bad input writes
nothing. (Separate processes: tests/faults/test_flow_limits_processes.py.)"""

from __future__ import annotations

from collections import Counter

import pytest

import conveyor
from conveyor import InvalidArgument, Rate
from conveyor.store.base import TaskStore


async def _running(store: TaskStore, queue: str, group: str | None = None) -> int:
    page = await store.list(queue=queue, status="running", group=group, limit=1000)
    return len(page.items)


async def test_configure_returns_the_settings_and_zero_clears(store: TaskStore) -> None:
    settings = await store.configure_queue(
        "q", concurrency=3, key_concurrency=1, rate=Rate(5, per=2), key_rate=Rate(1), fair=True
    )
    assert settings["concurrency"] == 3 and settings["key_concurrency"] == 1
    assert settings["rate"] == Rate(5, per=2.0) and settings["key_rate"] == Rate(1, per=1.0)
    assert settings["fair"] is True
    kept = await store.configure_queue("q", lease=10)
    assert kept["concurrency"] == 3 and kept["rate"] == Rate(5, 2)
    cleared = await store.configure_queue(
        "q", concurrency=0, key_concurrency=0, rate=0, key_rate=0, fair=False
    )
    assert cleared["concurrency"] is None and cleared["key_concurrency"] is None
    assert cleared["rate"] is None and cleared["key_rate"] is None and cleared["fair"] is False
    # No limits left: claims take the plain path again, all at once.
    await store.submit_many([{"name": "t", "queue": "q"}] * 5)
    assert len(await store.claim("q", worker_id="w", limit=10)) == 5


async def test_bad_input_is_refused_and_writes_nothing(store: TaskStore) -> None:
    for kwargs, field in (
        ({"concurrency": -1}, "concurrency"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"key_concurrency": True}, "key_concurrency"),
        ({"rate": 5}, "rate"),
        ({"key_rate": (5, 1)}, "key_rate"),
        ({"fair": "yes"}, "fair"),
    ):
        with pytest.raises(InvalidArgument) as bad:
            await store.configure_queue("q", **kwargs)  # type: ignore[arg-type]
        assert bad.value.field == field
    assert (await store.get_queue("q"))["concurrency"] is None
    for args, field in (((0,), "Rate.limit"), ((1.5,), "Rate.limit"), ((5, 0), "Rate.per")):
        with pytest.raises(InvalidArgument) as bad:
            Rate(*args)  # type: ignore[arg-type]
        assert bad.value.field == field
    for key in ("", "x" * 256, 7):
        with pytest.raises(InvalidArgument) as bad:
            await store.submit("t", queue="q", concurrency_key=key)  # type: ignore[arg-type]
        assert bad.value.field == "concurrency_key"
    with pytest.raises(InvalidArgument, match="partition"):
        await store.submit("t", queue="q", concurrency_key="k", partition="p")
    assert await store.stats() == []


async def test_concurrency_caps_running_across_stores(store: TaskStore, store_url: str) -> None:
    await store.configure_queue("q", concurrency=3)
    await store.submit_many([{"name": "t", "queue": "q"} for _ in range(10)])
    async with conveyor.connect(store_url) as other:
        first = await store.claim("q", worker_id="a", limit=2)
        second = await other.claim("q", worker_id="b", limit=10)
        assert (len(first), len(second)) == (2, 1)
        assert await store.claim("q", worker_id="a", limit=10) == []
        assert await _running(store, "q") == 3
        await store.succeed(first[0].id, worker_id="a")
        again = await other.claim("q", worker_id="b", limit=10)
        assert len(again) == 1 and await _running(store, "q") == 3


async def test_an_expired_lease_frees_its_slot(store: TaskStore) -> None:
    await store.configure_queue("q", concurrency=1)
    await store.submit_many([{"name": "t", "queue": "q"}] * 2)
    (held,) = await store.claim("q", worker_id="a", lease=0.2)
    assert await store.claim("q", worker_id="b") == []
    await store.heartbeat(held.id, worker_id="a", lease=0.05)
    import asyncio

    await asyncio.sleep(0.3)
    taken = await store.claim("q", worker_id="b", limit=5)
    assert len(taken) == 1 and await _running(store, "q") == 1


async def test_key_concurrency_limits_each_key_alone(store: TaskStore) -> None:
    await store.configure_queue("q", key_concurrency=1)
    reqs = [{"name": "t", "queue": "q", "concurrency_key": k} for k in "aaabbc"]
    await store.submit_many([*reqs, {"name": "t", "queue": "q"}, {"name": "t", "queue": "q"}])
    taken = await store.claim("q", worker_id="w", limit=10)
    # One per key, and the unkeyed tasks are not limited by it.
    assert len(taken) == 5
    assert await store.claim("q", worker_id="w", limit=10) == []
    a_task = next(t for t in taken if t.payload is None and t.id)  # any one of them
    await store.succeed(a_task.id, worker_id="w")
    rows = await store.list(queue="q", status="running", limit=100)
    assert len(rows.items) == 4


async def test_key_concurrency_counts_running_per_key(store: TaskStore, store_url: str) -> None:
    await store.configure_queue("q", key_concurrency=2)
    await store.submit_many(
        [{"name": "t", "queue": "q", "concurrency_key": f"k{i % 3}"} for i in range(30)]
    )
    async with conveyor.connect(store_url) as other:
        got = [*(await store.claim("q", worker_id="a", limit=1))]
        got += await other.claim("q", worker_id="b", limit=3)
        got += await store.claim("q", worker_id="a", limit=30)
        got += await other.claim("q", worker_id="b", limit=30)
        assert len(got) == 6


async def test_a_rate_limits_the_starts(store: TaskStore, store_url: str) -> None:
    # 5 per minute: a burst of 5, then nothing for 12 s (the test takes less).
    await store.configure_queue("q", rate=Rate(5, per=60))
    await store.submit_many([{"name": "t", "queue": "q"}] * 20)
    async with conveyor.connect(store_url) as other:
        first = await store.claim("q", worker_id="a", limit=3)
        second = await other.claim("q", worker_id="b", limit=100)
        assert (len(first), len(second)) == (3, 2)
        for t in first + second:
            await store.succeed(t.id, worker_id=t.worker_id or "")
        assert await other.claim("q", worker_id="b", limit=100) == []


async def test_a_key_rate_limits_each_key(store: TaskStore) -> None:
    await store.configure_queue("q", key_rate=Rate(2, per=60))
    await store.submit_many(
        [{"name": "t", "queue": "q", "concurrency_key": k} for k in "aaaabbbb"]
        + [{"name": "t", "queue": "q"}] * 3
    )
    taken = await store.claim("q", worker_id="w", limit=100)
    assert len(taken) == 2 + 2 + 3
    assert await store.claim("q", worker_id="w", limit=100) == []


async def test_fair_claims_take_turns_across_keys(store: TaskStore) -> None:
    await store.configure_queue("q", fair=True)
    await store.submit_many(
        [{"name": "a", "queue": "q", "concurrency_key": "A"} for _ in range(200)]
    )
    await store.submit("b", queue="q", concurrency_key="B")
    await store.submit("n", queue="q")  # no key: a tenant of its own
    first = await store.claim("q", worker_id="w", limit=3)
    assert Counter(t.name for t in first) == {"a": 1, "b": 1, "n": 1}
    # One at a time too: B's next task goes before A's backlog.
    await store.submit("b", queue="q", concurrency_key="B")
    names = [t.name for _ in range(4) for t in await store.claim("q", worker_id="w")]
    assert names.count("b") == 1 and names.index("b") <= 1


async def test_without_fair_the_backlog_goes_first(store: TaskStore) -> None:
    # The counter-test: the plain claim order would keep B behind A's 200.
    await store.configure_queue("q", key_concurrency=1000)
    await store.submit_many([{"name": "a", "queue": "q", "concurrency_key": "A"}] * 200)
    await store.submit("b", queue="q", concurrency_key="B")
    first = await store.claim("q", worker_id="w", limit=3)
    assert [t.name for t in first] == ["a", "a", "a"]


async def test_groups_are_limited_apart(store: TaskStore) -> None:
    await store.subscribe("q", "g1")
    await store.subscribe("q", "g2")
    await store.configure_queue("q", concurrency=2)
    await store.submit_many([{"name": "t", "queue": "q"}] * 6)
    assert len(await store.claim("q", worker_id="w", limit=10, group="g1")) == 2
    assert len(await store.claim("q", worker_id="w", limit=10, group="g2")) == 2
    assert len(await store.claim("q", worker_id="w", limit=10)) == 2
    assert await store.claim("q", worker_id="w", limit=10, group="g1") == []
    assert await _running(store, "q", "g1") == 2


async def test_partitioned_tasks_count_against_the_queue(store: TaskStore) -> None:
    await store.configure_queue("q", concurrency=2, key_concurrency=1)
    await store.submit_many(
        [{"name": "p", "queue": "q", "partition": f"p{i}"} for i in range(3)]
        + [{"name": "k", "queue": "q", "concurrency_key": "k"} for _ in range(3)]
    )
    got = []
    for _ in range(4):
        got += await store.claim("q", worker_id="w", limit=10, per_stream=1)
    assert len(got) == 2 and await _running(store, "q") == 2


async def test_a_paused_limited_queue_leases_nothing(store: TaskStore) -> None:
    await store.configure_queue("q", concurrency=5)
    await store.submit_many([{"name": "t", "queue": "q"}] * 2)
    await store.pause("q")
    assert await store.claim("q", worker_id="w", limit=5) == []
    await store.resume("q")
    assert len(await store.claim("q", worker_id="w", limit=5)) == 2


async def test_limited_and_plain_queues_in_one_claim(store: TaskStore) -> None:
    await store.configure_queue("lim", concurrency=1)
    await store.submit_many(
        [{"name": "t", "queue": "lim"}] * 3 + [{"name": "t", "queue": "free"}] * 3
    )
    taken = await store.claim(["lim", "free"], worker_id="w", limit=10)
    assert Counter(t.queue for t in taken) == {"free": 3, "lim": 1}


async def _rate_rows(store: TaskStore) -> set[tuple[int, str]]:
    from sqlalchemy import select

    from conveyor.schema import rate_state

    assert store._engine is not None
    async with store._engine.connect() as conn:
        rows = await conn.execute(select(rate_state.c.scope, rate_state.c.key))
        return {(int(r.scope), str(r.key)) for r in rows}


async def test_maintain_prunes_the_rate_state_that_limits_nothing(store: TaskStore) -> None:
    from conveyor.store.protocol.upkeep import RATE_STATE_KEEP

    await store.configure_queue("q", rate=Rate(100), key_rate=Rate(1, per=60), fair=True)
    await store.submit_many(
        [{"name": "t", "queue": "q", "concurrency_key": key} for key in ("old1", "old2")]
    )
    for task in await store.claim("q", worker_id="w", limit=10):
        await store.succeed(task.id, worker_id="w", attempt=task.attempt)
    # The queue's rate (scope 0), each key's rate (1) and its last turn (2).
    old = {(0, ""), (1, "old1"), (1, "old2"), (2, "old1"), (2, "old2")}
    await store.maintain()
    assert await _rate_rows(store) == old  # all still within their time: kept
    # Past every old row's time by more than the keep; then a new key is served.
    store.clock_offset = RATE_STATE_KEEP + 61
    assert await _running(store, "q") == 0
    await store.submit("t", queue="q", concurrency_key="new")
    assert len(await store.claim("q", worker_id="w", limit=10)) == 1
    assert await _rate_rows(store) == old | {(1, "new"), (2, "new")}
    await store.maintain()
    assert await _rate_rows(store) == {(0, ""), (1, "new"), (2, "new")}
    # A pruned key is limited afresh: a full burst (of 1), then held.
    await store.submit_many([{"name": "t", "queue": "q", "concurrency_key": "old1"}] * 2)
    assert len(await store.claim("q", worker_id="w", limit=10)) == 1
    assert await store.claim("q", worker_id="w", limit=10) == []
