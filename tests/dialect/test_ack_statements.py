"""The acknowledgement statements of the catalogue (``succeed_plain``, ``ack_plain``,
``ack_streams_lock``, ``ack_streams``, and ``task_views``, which reads tasks back)
against their contracts, run by themselves on both backends: each item fenced on
its own, the 1-based positions of the items not finished (a single NULL row when
all were), the streams of the finished rows recomputed and the freed ones
counted, and the completion heard by a ``wait()`` in another process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from conveyor import Status
from conveyor.models import Task
from conveyor.store.base import TaskStore
from conveyor.store.protocol import texts


def _items(*entries: tuple[str, str, str, int | None, Any]) -> dict[str, str]:
    """The ``items`` parameter: [id, worker_id, grp, attempt, result JSON] each."""
    rows = [[i, w, g, a, json.dumps(r)] for i, w, g, a, r in entries]
    return {"items": json.dumps(rows)}


async def _text(store: TaskStore, name: str) -> texts.Text:
    text = (await texts.of(store)).get(name)
    assert text is not None, name
    return text


async def _pair(store: TaskStore, params: dict[str, str]) -> list[Any]:
    lock, ack = await _text(store, "ack_streams_lock"), await _text(store, "ack_streams")
    return await texts.together(store, [(lock, params), (ack, params)])


async def _status(store: TaskStore, task: Task, group: str | None = None) -> Status:
    got = await store.get(task.id, group=group)
    assert got is not None
    return got.status


async def test_succeed_plain_finishes_one_fenced_unpartitioned_row(store: TaskStore) -> None:
    plain, streamed = await store.submit_many(
        [{"name": "t", "queue": "q"}, {"name": "t", "queue": "q", "partition": "p"}]
    )
    held = await store.claim("q", worker_id="w", limit=2, per_stream=1)
    assert {t.id for t in held} == {plain.id, streamed.id}
    attempt = next(t.attempt for t in held if t.id == plain.id)
    text = await _text(store, "succeed_plain")

    def params(task_id: str, worker: str = "w", at: int | None = None) -> dict[str, Any]:
        return {"id": task_id, "worker_id": worker, "grp": "", "attempt": at, "result": "[1]"}

    # The fence: another worker, another attempt, an unknown task; a partitioned row
    # is not this statement's. Nothing is written.
    for miss in (
        params(plain.id, worker="other"),
        params(plain.id, at=attempt + 1),
        params("no-such-task"),
        params(streamed.id),
    ):
        assert await texts.alone(store, text, miss) == []
    assert await _status(store, plain) is Status.RUNNING
    assert await _status(store, streamed) is Status.RUNNING
    (row,) = await texts.alone(store, text, params(plain.id, at=attempt))
    assert (row.id, row.status, row.result, row.worker_id) == (plain.id, "succeeded", "[1]", "w")
    assert row.seq is not None and row.finished_at is not None and row.lease_expires_at is None
    assert row.name == "t" and row.queue == "q" and row.partition is None
    done = await store.get(plain.id)
    assert done is not None and done.status is Status.SUCCEEDED and done.result == [1]
    # Finished: the fence fails from now on.
    assert await texts.alone(store, text, params(plain.id)) == []


async def test_ack_plain_fences_each_item_and_reports_those_it_left(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    a, b, c, d, streamed = await store.submit_many(
        [{"name": "t", "queue": "q"} for _ in range(4)]
        + [{"name": "t", "queue": "q", "partition": "p"}]
    )
    held = {t.id: t for t in await store.claim("q", worker_id="w", limit=5, per_stream=1)}
    assert set(held) == {a.id, b.id, c.id, d.id, streamed.id}
    [in_group] = await store.claim("q", worker_id="w", limit=1, group="g")
    params = _items(
        (a.id, "w", "", held[a.id].attempt, {"n": 1}),  # 1: finished, attempt given
        (b.id, "w", "", None, "b"),  # 2: finished, any attempt
        (c.id, "w", "", held[c.id].attempt + 1, None),  # 3: another attempt
        (d.id, "other", "", None, None),  # 4: another worker
        (streamed.id, "w", "", None, None),  # 5: partitioned: not this statement's
        ("no-such-task", "w", "", None, None),  # 6: unknown
        (in_group.id, "w", "g", None, "g"),  # 7: finished in its group
        (in_group.id, "w", "h", None, None),  # 8: a group it has no row in
    )
    rows = await texts.alone(store, await _text(store, "ack_plain"), params)
    assert sorted(row.idx for row in rows) == [3, 4, 5, 6, 8]
    for task, result in ((a, {"n": 1}), (b, "b")):
        got = await store.get(task.id)
        assert got is not None and got.status is Status.SUCCEEDED and got.result == result
    for task in (c, d, streamed):
        assert await _status(store, task) is Status.RUNNING
    assert await _status(store, in_group, group="g") is Status.SUCCEEDED
    # Every item finished: one row, its idx NULL.
    again = _items((c.id, "w", "", held[c.id].attempt, 3), (d.id, "w", "", None, 4))
    rows = await texts.alone(store, await _text(store, "ack_plain"), again)
    assert [row.idx for row in rows] == [None]


async def test_ack_streams_finishes_any_rows_and_recomputes_their_streams(
    store: TaskStore,
) -> None:
    p1, p2, q1, q2, plain = await store.submit_many(
        [{"name": "t", "queue": "q", "partition": p} for p in ("p", "p", "r", "r")]
        + [{"name": "t", "queue": "q"}]
    )
    # p's head and r's first two tasks (so r stays held while q2 is leased), plain.
    got = await store.claim("q", worker_id="w", limit=1, partition="p")
    got += await store.claim("q", worker_id="w", limit=2, partition="r")
    got += await store.claim("q", worker_id="w", limit=1)
    assert [t.id for t in got] == [p1.id, q1.id, q2.id, plain.id]
    params = _items(
        (p1.id, "w", "", None, "p1"),  # 1: finished: p's head moves on to p2, free
        (q1.id, "w", "", None, "q1"),  # 2: finished: r stays held by q2
        (plain.id, "w", "", None, "x"),  # 3: unpartitioned rows too
        (p2.id, "w", "", None, None),  # 4: queued, not leased: its fence fails
    )
    rows = await _pair(store, params)
    assert [row.idx for row in rows] == [4]
    assert rows[0].freed == 1  # p's head is claimable; r's is not
    for task in (p1, q1, plain):
        assert await _status(store, task) is Status.SUCCEEDED
    assert await store.claim("q", worker_id="x", partition="r") == []
    [nxt] = await store.claim("q", worker_id="x")
    assert nxt.id == p2.id
    # r's last leased task finished: its stream is recomputed, nothing left in it.
    rows = await _pair(store, _items((q2.id, "w", "", None, None)))
    assert [(row.idx, row.freed) for row in rows] == [(None, 0)]
    assert await _status(store, q2) is Status.SUCCEEDED


async def test_ack_streams_frees_a_stream_in_each_group(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    first, second = await store.submit_many(
        [{"name": "t", "queue": "q", "partition": "p"} for _ in range(2)]
    )
    [mine] = await store.claim("q", worker_id="w")
    [theirs] = await store.claim("q", worker_id="w", group="g")
    assert mine.id == theirs.id == first.id
    params = _items((first.id, "w", "", None, 1), (first.id, "w", "g", mine.attempt, 2))
    rows = await _pair(store, params)
    assert [(row.idx, row.freed) for row in rows] == [(None, 2)]
    [nxt] = await store.claim("q", worker_id="x", group="g")
    assert nxt.id == second.id
    done = await store.get(first.id, group="g")
    assert done is not None and done.result == 2


async def test_task_views_reads_the_tasks_as_a_group_sees_them(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    a, b = await store.submit_many([{"name": "t", "queue": "q"} for _ in range(2)])
    [got] = await store.claim("q", worker_id="w", group="g")
    views = await _text(store, "task_views")
    ids = json.dumps([a.id, b.id, "no-such-task"])
    rows = await texts.alone(store, views, {"ids": ids, "grp": "g"}, write=False)
    seen = {row.id: (row.grp, row.status, row.worker_id) for row in rows}
    assert seen == {
        got.id: ("g", "running", "w"),
        ({a.id, b.id} - {got.id}).pop(): ("g", "queued", None),
    }
    rows = await texts.alone(store, views, {"ids": json.dumps([a.id]), "grp": "h"}, write=False)
    assert rows == []  # no row in a group it is not delivered to


async def test_ack_streams_lock_takes_the_stream_rows_until_commit(
    store: TaskStore, backend: str, store_url: str
) -> None:
    """Postgres: the stream rows of the items' partitions are locked in the
    transaction that runs it (another transaction cannot take them). SQLite: one
    writer holds the whole database, so it takes nothing and writes nothing."""
    task = await store.submit("t", queue="q", partition="p")
    [got] = await store.claim("q", worker_id="w")
    lock = await _text(store, "ack_streams_lock")
    params = _items((got.id, "w", "", None, None))
    seen: list[str] = []

    async def work(conn: Any) -> None:
        await texts.execute(conn, store, lock, params)
        if backend == "postgres":
            dsn = make_url(store_url).set(drivername="postgresql")
            with psycopg.connect(dsn.render_as_string(hide_password=False)) as other:
                try:
                    other.execute(
                        "SELECT 1 FROM conveyor_streams WHERE partition = 'p' FOR UPDATE NOWAIT"
                    )
                except psycopg.errors.LockNotAvailable:
                    seen.append("locked")

    await store._run(work)
    assert seen == (["locked"] if backend == "postgres" else [])
    assert await _status(store, task) is Status.RUNNING


_WAIT = """
import asyncio, sys
import conveyor

async def main():
    async with conveyor.connect(sys.argv[1]) as store:
        print("ready", flush=True)
        task = await store.wait(sys.argv[2], timeout=60)
        print(task.status.value, flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("partition", [None, "p"])
async def test_a_wait_in_another_process_hears_the_completion(
    store: TaskStore, store_url: str, partition: str | None
) -> None:
    task = await store.submit("t", queue="q", partition=partition)
    [got] = await store.claim("q", worker_id="w")
    child = subprocess.Popen(
        [sys.executable, "-c", _WAIT, store_url, task.id],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        await asyncio.sleep(0.2)  # most likely waiting by now; if not, it reads the row
        items = [{"task_id": got.id, "worker_id": "w", "attempt": got.attempt}]
        assert await store.ack_many(items, partitioned=partition is not None) == [None]
        out, _ = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert out.strip() == "succeeded"
    assert child.returncode == 0
