"""submit, submit_many, get, get_by_key: what a new task looks like (SPEC §2.0, §2.1)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

import conveyor
from _support import assert_empty, is_utc, seconds, utcnow
from conveyor import InvalidArgument, Status, Task
from conveyor.store.base import TaskStore

CLOCK_SLACK = 1.0  # seconds between the test's clock and the store's (same host)


async def test_new_task_has_the_documented_defaults(store: TaskStore) -> None:
    before = utcnow()
    task = await store.submit("job")
    after = utcnow()

    assert isinstance(task, Task)
    assert isinstance(task.id, str) and task.id
    assert task.name == "job"
    assert task.queue == "default"
    assert task.partition is None
    assert task.payload is None
    assert task.metadata == {}
    assert task.priority == 0
    assert task.status is Status.QUEUED and task.status.value == "queued"
    assert task.attempt == 0
    assert task.max_attempts == 3
    assert task.started_at is None and task.finished_at is None
    assert task.lease_expires_at is None and task.worker_id is None
    assert task.progress is None and task.progress_message is None
    assert task.result is None and task.error is None
    assert task.key is None and task.parent_id is None and task.correlation_id is None
    assert task.root_id == task.id
    assert task.group is None
    assert not task.terminal
    assert is_utc(task.created_at) and is_utc(task.run_at)
    assert before - timedelta(seconds=CLOCK_SLACK) <= task.created_at
    assert task.created_at <= after + timedelta(seconds=CLOCK_SLACK)
    # due now: run_at is the submit time
    assert abs(seconds(task.run_at - task.created_at)) < 0.05


async def test_task_is_an_immutable_snapshot(store: TaskStore) -> None:
    task = await store.submit("job")
    with pytest.raises(AttributeError):
        task.status = Status.RUNNING  # type: ignore[misc]
    assert dataclasses.is_dataclass(task)


async def test_explicit_fields_are_stored(store: TaskStore) -> None:
    task = await store.submit(
        "send",
        {"to": "a@b.c"},
        queue="emails",
        priority=7,
        max_attempts=5,
        partition="cust-1",
        correlation_id="corr-9",
        metadata={"trace": "abc", "n": 1},
    )
    assert (task.name, task.queue, task.priority, task.max_attempts) == ("send", "emails", 7, 5)
    assert task.partition == "cust-1"
    assert task.correlation_id == "corr-9"
    assert task.metadata == {"trace": "abc", "n": 1}
    assert task.payload == {"to": "a@b.c"}
    assert await store.get(task.id) == task


PAYLOADS: list[Any] = [
    None,
    0,
    -12345678901234,
    1.5,
    True,
    "text ünïcødé ✓",
    "{braces} and [brackets]",
    [1, "two", None, [3.25]],
    {"nested": {"list": [1, 2, {"x": None}], "flag": False}, "emoji": "🚀"},
    {"quote'": 'double"', "sql": "'; DROP TABLE conveyor_tasks; --"},
    {"nul\x00key": "nul\x00value", "control": "\t\n\x1b"},
]


@pytest.mark.parametrize(
    "payload",
    [
        None,
        0,
        -12345678901234,
        1.5,
        True,
        "text ünïcødé ✓",
        [1, "two", None, [3.25]],
        {"nested": {"list": [1, 2, {"x": None}], "flag": False}, "emoji": "🚀"},
        {"quote'": 'double"', "sql": "'; DROP TABLE conveyor_tasks; --"},
        {"nul\x00key": "nul\x00value", "control": "\t\n\x1b"},
    ],
)
async def test_payload_round_trips_as_json(store: TaskStore, payload: Any) -> None:
    task = await store.submit("job", payload)
    assert task.payload == payload
    fetched = await store.get(task.id)
    assert fetched is not None and fetched.payload == payload


async def test_submit_many_returns_what_it_stored(store: TaskStore) -> None:
    # Payloads of every JSON shape in one batch, metadata given or not, options left
    # to the queue's settings for all or given for some.
    await store.configure_queue("q-set", max_attempts=7, backoff=2)
    plain = await store.submit_many(
        [
            {
                "name": "p",
                "payload": payload,
                "queue": "q-set",
                "metadata": {"i": i} if i % 2 else None,
            }
            for i, payload in enumerate(PAYLOADS)
        ]
    )
    mixed = await store.submit_many(
        [
            {"name": "m", "queue": "q-set", "max_attempts": 2, "correlation_id": "c"},
            {"name": "m", "queue": "q-set", "delay": 5},
            {"name": "m", "queue": "other", "priority": -3},
        ]
    )
    assert [t.payload for t in plain] == PAYLOADS
    assert [t.metadata for t in plain] == [{"i": i} if i % 2 else {} for i in range(len(PAYLOADS))]
    assert {t.max_attempts for t in plain} == {7}
    assert [t.max_attempts for t in mixed] == [2, 7, 3]
    assert [t.correlation_id for t in mixed] == ["c", None, None]
    assert [t.priority for t in mixed] == [0, 0, -3]
    assert seconds(mixed[1].run_at - mixed[1].created_at) == pytest.approx(5, abs=0.1)
    assert mixed[0].run_at == mixed[0].created_at
    for t in plain + mixed:
        assert await store.get(t.id) == t


async def test_get_returns_what_submit_returned(store: TaskStore) -> None:
    task = await store.submit("job", {"a": 1}, key="k-get")
    assert await store.get(task.id) == task
    assert await store.get_by_key("k-get") == task


async def test_get_unknown_is_none(store: TaskStore) -> None:
    task = await store.submit("job")
    assert await store.get("01ARZ3NDEKTSV4RRFFQ69G5FAV") is None
    assert await store.get(task.id + "x") is None
    assert await store.get_by_key("no-such-key") is None


async def test_ids_are_unique_and_increase_in_submit_order(store: TaskStore) -> None:
    ids: list[str] = []
    created: list[datetime] = []
    for i in range(20):
        t = await store.submit("job", {"i": i})
        ids.append(t.id)
        created.append(t.created_at)
    batch = await store.submit_many([{"name": "job", "payload": {"i": i}} for i in range(30)])
    ids += [t.id for t in batch]
    created += [t.created_at for t in batch]
    for i in range(5):
        t = await store.submit("job", {"i": i})
        ids.append(t.id)
        created.append(t.created_at)
    assert len(set(ids)) == len(ids) == 55
    assert ids == sorted(ids)
    assert created == sorted(created)


async def test_parent_and_root_ids(store: TaskStore) -> None:
    root = await store.submit("root")
    child = await store.submit("child", parent=root)
    grandchild = await store.submit("grandchild", parent=child.id)
    assert root.parent_id is None and root.root_id == root.id
    assert child.parent_id == root.id and child.root_id == root.id
    assert grandchild.parent_id == child.id and grandchild.root_id == root.id
    [listed] = (await store.list(root_id=root.id, name="grandchild")).items
    assert listed == grandchild


async def test_correlation_id_is_kept_as_given(store: TaskStore) -> None:
    a = await store.submit("a", correlation_id="order-17")
    b = await store.submit("b", correlation_id="order-17")
    assert a.correlation_id == b.correlation_id == "order-17"
    assert a.root_id != b.root_id


async def test_delay_makes_the_task_due_later(store: TaskStore) -> None:
    task = await store.submit("later", queue="q", delay=30)
    assert 29.9 <= seconds(task.run_at - task.created_at) <= 30.1
    assert await store.claim("q", worker_id="w") == []
    store.clock_offset = 29
    assert await store.claim("q", worker_id="w") == []
    store.clock_offset = 30.5
    [claimed] = await store.claim("q", worker_id="w")
    assert claimed.id == task.id


async def test_delay_as_timedelta(store: TaskStore) -> None:
    task = await store.submit("later", queue="q", delay=timedelta(minutes=2))
    assert 119.9 <= seconds(task.run_at - task.created_at) <= 120.1
    assert await store.claim("q", worker_id="w") == []


async def test_small_delay_elapses_in_real_time(store: TaskStore) -> None:
    task = await store.submit("soon", queue="q", delay=0.3)
    assert await store.claim("q", worker_id="w") == []
    await asyncio.sleep(0.35)
    [claimed] = await store.claim("q", worker_id="w")
    assert claimed.id == task.id


async def test_run_at_in_the_future(store: TaskStore) -> None:
    when = utcnow() + timedelta(seconds=60)
    task = await store.submit("scheduled", queue="q", run_at=when)
    assert task.run_at == when
    assert is_utc(task.run_at)
    assert await store.claim("q", worker_id="w") == []
    store.clock_offset = 61
    [claimed] = await store.claim("q", worker_id="w")
    assert claimed.id == task.id


async def test_run_at_in_the_past_is_due_now_and_kept_exactly(store: TaskStore) -> None:
    when = datetime(2020, 5, 17, 10, 30, 15, 123456, tzinfo=UTC)
    task = await store.submit("overdue", queue="q", run_at=when)
    assert task.run_at == when
    [claimed] = await store.claim("q", worker_id="w")
    assert claimed.id == task.id


async def test_run_at_in_another_timezone_comes_back_in_utc(store: TaskStore) -> None:
    plus_two = timezone(timedelta(hours=2))
    when = datetime(2021, 1, 1, 12, 0, 0, 500, tzinfo=plus_two)
    task = await store.submit("tz", run_at=when)
    assert task.run_at == when
    assert is_utc(task.run_at)
    assert task.run_at.hour == 10


async def test_submit_many_returns_tasks_in_request_order(store: TaskStore) -> None:
    tasks = await store.submit_many(
        [
            {"name": "a", "payload": {"n": 1}, "queue": "q1"},
            {"name": "b", "queue": "q2", "priority": 3, "max_attempts": 9},
            {"name": "c", "metadata": {"m": True}, "correlation_id": "c1"},
            {"name": "d", "delay": 10},
        ]
    )
    assert [t.name for t in tasks] == ["a", "b", "c", "d"]
    a, b, c, d = tasks
    assert a.payload == {"n": 1} and a.queue == "q1"
    assert (b.queue, b.priority, b.max_attempts) == ("q2", 3, 9)
    assert c.metadata == {"m": True} and c.correlation_id == "c1" and c.queue == "default"
    assert seconds(d.run_at - d.created_at) == pytest.approx(10, abs=0.1)
    for t in tasks:
        assert await store.get(t.id) == t
    assert len((await store.list()).items) == 4


async def test_submit_many_of_nothing(store: TaskStore) -> None:
    assert await store.submit_many([]) == []
    await assert_empty(store)


async def test_submit_many_is_one_transaction_bad_request_writes_nothing(
    store: TaskStore,
) -> None:
    with pytest.raises(InvalidArgument) as info:
        await store.submit_many(
            [
                {"name": "ok1", "payload": {"x": 1}},
                {"name": "ok2", "key": "k1"},
                {"name": "bad", "payload": object()},
            ]
        )
    assert info.value.field == "payload"
    await assert_empty(store)
    assert await store.get_by_key("k1") is None


async def test_submit_many_rolls_back_on_a_failure_inside_the_transaction(
    store: TaskStore,
) -> None:
    # An unknown parent can only be detected by reading the database.
    with pytest.raises(InvalidArgument) as info:
        await store.submit_many(
            [
                {"name": "ok", "key": "k-tx"},
                {"name": "orphan", "parent": "01ARZ3NDEKTSV4RRFFQ69G5FAV"},
            ]
        )
    assert info.value.field == "parent"
    await assert_empty(store)
    assert await store.get_by_key("k-tx") is None


async def test_submit_many_rolls_back_on_a_rejected_key(store: TaskStore) -> None:
    existing = await store.submit("first", key="taken")
    with pytest.raises(conveyor.AlreadyExists):
        await store.submit_many(
            [{"name": "new1"}, {"name": "new2", "key": "taken", "conflict": "reject"}]
        )
    items = (await store.list()).items
    assert items == [existing]


# Larger than a few runs of the Postgres bulk path (conveyor.store.protocol.submit_runs.RUN), and
# not a multiple of one: the last run is short.
LARGE = 1_111


def _large(n: int = LARGE) -> list[dict[str, Any]]:
    return [
        {"name": f"t{i}", "payload": {"i": i}, "queue": "big", "priority": i % 3, "delay": 0}
        for i in range(n)
    ]


async def test_a_large_batch_keeps_request_order_and_every_field(store: TaskStore) -> None:
    requests = _large()
    requests[700] = {**requests[700], "max_attempts": 7, "correlation_id": "c700"}
    tasks = await store.submit_many(iter(requests))  # any iterable, taken as it goes
    assert [t.payload["i"] for t in tasks] == list(range(LARGE))
    assert [t.id for t in tasks] == sorted(t.id for t in tasks)
    assert (tasks[700].max_attempts, tasks[700].correlation_id) == (7, "c700")
    # Each statement reads its clock: later requests were never stored earlier.
    assert [t.created_at for t in tasks] == sorted(t.created_at for t in tasks)
    for i in (0, 249, 250, 700, LARGE - 1):
        assert await store.get(tasks[i].id) == tasks[i]
    # Stored in request order: within a priority, claimed in the order submitted.
    claimed = await store.claim("big", worker_id="w", limit=LARGE)
    assert [t.payload["i"] for t in claimed] == sorted(range(LARGE), key=lambda i: (-(i % 3), i))
    [stats] = await store.stats()
    assert stats.counts["running"] == LARGE and stats.counts["queued"] == 0


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"name": "t", "priority": "high"}, "priority"),
        ("not a dict", "requests[1000]"),
        ({"name": "t", "payload": float("nan")}, "payload"),
    ],
)
async def test_a_bad_request_late_in_a_large_batch_writes_nothing(
    store: TaskStore, bad: Any, field: str
) -> None:
    requests: list[Any] = _large()
    requests[1000] = bad
    with pytest.raises(InvalidArgument) as info:
        await store.submit_many(requests)
    assert info.value.field == field
    await assert_empty(store)
    # The store goes on working (a connection left mid-transaction is not reused).
    again = await store.submit_many(_large(300))
    assert len(again) == 300 and len((await store.list(limit=1000)).items) == 300


async def test_a_keyed_request_late_in_a_large_batch(store: TaskStore) -> None:
    earlier = await store.submit("earlier", key="k-late")
    requests = _large()
    requests[600] = {"name": "keyed", "key": "k-late"}
    requests[900] = {"name": "child", "parent": earlier.id}
    tasks = await store.submit_many(requests)
    assert len(tasks) == LARGE
    assert tasks[600] == earlier  # the key reused its task
    assert tasks[900].parent_id == earlier.id
    assert [t.payload["i"] for t in tasks[:600]] == list(range(600))
    assert len((await store.list(limit=2000)).items) == LARGE  # 1,110 new and the keyed one


@pytest.mark.parametrize("bad", [None, 5, {"name": "a"}])
async def test_submit_many_wants_a_list_of_requests(store: TaskStore, bad: Any) -> None:
    with pytest.raises(InvalidArgument) as info:
        await store.submit_many(bad)
    assert info.value.field == "requests"
    await assert_empty(store)


async def test_submit_many_unknown_argument(store: TaskStore) -> None:
    with pytest.raises(InvalidArgument) as info:
        await store.submit_many([{"name": "a"}, {"name": "b", "colour": "red"}])
    assert info.value.field == "colour"
    await assert_empty(store)


async def test_store_can_be_closed_and_reopened(store_url: str) -> None:
    store = conveyor.connect(store_url)
    async with store:
        task = await store.submit("t")
    async with store:
        assert await store.get(task.id) == task
    assert await store.get(task.id) == task  # the first call opens it again
    await store.close()
