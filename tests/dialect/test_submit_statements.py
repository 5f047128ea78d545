"""The submit's statements (:mod:`conveyor.store.catalogue`) on both backends, run
by themselves: what each writes (task rows, delivery rows for queue mode and every
active group, stream rows), what it returns, and what it refuses."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from sqlalchemy import text

from conveyor import _values as v
from conveyor.store.base import TaskStore
from conveyor.store.protocol import texts

MISSING = "01ARZ3NDEKTSV4RRFFQ69G5FAZ"


async def _rows(store: TaskStore, sql: str, **params: Any) -> list[Any]:
    async def work(conn: Any) -> list[Any]:
        return list(await conn.execute(text(sql), params))

    return list(await store._run(work, write=False))


async def _run(store: TaskStore, name: str, params: dict[str, Any]) -> list[Any]:
    await store.open()
    assert store._texts is not None
    return await texts.alone(store, store._texts[name], params)


def _plain(ids: list[str], queues: list[str], **lists: Any) -> dict[str, Any]:
    n = len(ids)
    out: dict[str, Any] = {
        "ids": ids,
        "names": [f"n{i}" for i in range(n)],
        "queues": queues,
        "payloads": [f'{{"i": {i}}}' for i in range(n)],
        "metadatas": ["{}"] * n,
        "priorities": list(range(n)),
        "max_attempts": None,
        "backoffs": None,
        "delays": None,
        "run_ats": None,
        "correlation_ids": None,
    }
    out.update(lists)
    return out


def _one(task_id: str, queue: str = "q", **values: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": task_id,
        "name": "n",
        "queue": queue,
        "payload": "{}",
        "metadata": "{}",
        "priority": 0,
        "max_attempts": None,
        "backoff": None,
        "delay": None,
        "run_at": None,
        "correlation_id": None,
    }
    out.update(values)
    return out


async def _deliveries(store: TaskStore, task_id: str) -> list[tuple[str, str | None]]:
    found = await _rows(
        store,
        "SELECT d.grp, d.partition FROM conveyor_deliveries AS d "
        "JOIN conveyor_tasks AS t ON t.seq = d.task_seq WHERE t.id = :id ORDER BY d.grp",
        id=task_id,
    )
    return [(row.grp, row.partition) for row in found]


async def _count(store: TaskStore) -> int:
    return int((await _rows(store, "SELECT count(*) AS n FROM conveyor_tasks"))[0].n)


@pytest.fixture
async def subscribed(store: TaskStore) -> TaskStore:
    """A store whose queue ``q`` has stored settings and an active group ``g``."""
    await store.configure_queue("q", max_attempts=7, backoff={"base": 2.0})
    await store.subscribe("q", "g")
    return store


@pytest.mark.parametrize("name", ["submit_plain", "submit_plain_in"])
async def test_submit_plain_writes_the_tasks_and_their_deliveries(
    subscribed: TaskStore, name: str
) -> None:
    """Tasks in request order, each with the option given, else its queue's
    setting, else the default; a delivery row for queue mode and every active group
    of its queue; a row of what was decided per task. A list given as NULL is NULL
    for every task."""
    store = subscribed
    ids = [v.new_task_id() for _ in range(4)]
    before = v.now_us()
    rows = await _run(
        store,
        name,
        _plain(
            ids,
            ["q", "q", "q", "other"],
            max_attempts=[5, None, None, None],
            delays=[None, 60_000_000, None, None],
            run_ats=[None, None, 123, None],
            correlation_ids=["c", None, None, None],
        ),
    )
    got = {row.id: row for row in rows}
    assert sorted(got) == sorted(ids)
    assert [got[i].max_attempts for i in ids] == [5, 7, 7, 3]
    now = got[ids[0]].created_at
    assert {row.created_at for row in rows} == {now}
    assert before - 5_000_000 < now < v.now_us() + 5_000_000
    assert [got[i].run_at for i in ids] == [now, now + 60_000_000, 123, now]
    stored = await _rows(
        store,
        "SELECT id, name, payload, priority, backoff, correlation_id, root_id, partition "
        "FROM conveyor_tasks ORDER BY seq",
    )
    assert [row.id for row in stored] == ids
    assert [row.payload for row in stored] == ['{"i": 0}', '{"i": 1}', '{"i": 2}', '{"i": 3}']
    assert [row.priority for row in stored] == [0, 1, 2, 3]
    assert [row.correlation_id for row in stored] == ["c", None, None, None]
    assert [row.root_id for row in stored] == ids
    assert [row.backoff is not None for row in stored] == [True, True, True, False]
    for task_id in ids[:3]:
        assert await _deliveries(store, task_id) == [("", None), ("g", None)]
    assert await _deliveries(store, ids[3]) == [("", None)]


@pytest.mark.parametrize("name", ["submit_one", "submit_one_in"])
async def test_submit_one_writes_one_task_and_its_deliveries(
    subscribed: TaskStore, name: str
) -> None:
    store = subscribed
    task_id = v.new_task_id()
    (row,) = await _run(store, name, _one(task_id, delay=1_000_000, priority=3))
    assert (row.id, row.max_attempts, row.run_at - row.created_at) == (task_id, 7, 1_000_000)
    assert await _deliveries(store, task_id) == [("", None), ("g", None)]
    (alone,) = await _run(store, name, _one(v.new_task_id(), "other", max_attempts=2))
    assert alone.max_attempts == 2 and alone.run_at == alone.created_at
    assert await _count(store) == 2


@pytest.mark.parametrize("name", ["submit_children", "submit_children_in"])
async def test_submit_children_takes_each_parents_root(subscribed: TaskStore, name: str) -> None:
    """Each child's root is its parent's; a task without a parent is its own root;
    rows carry ``root_id`` and a NULL ``orphan``."""
    store = subscribed
    root, child = v.new_task_id(), v.new_task_id()
    await _run(store, "submit_one", _one(root))
    await _run(store, name, {**_plain([child], ["q"]), "parent_ids": [root]})
    ids = [v.new_task_id() for _ in range(3)]
    rows = await _run(store, name, {**_plain(ids, ["q"] * 3), "parent_ids": [child, None, root]})
    got = {row.id: row for row in rows}
    assert [got[i].root_id for i in ids] == [root, ids[1], root]
    assert {row.orphan for row in rows} == {None}
    assert [got[i].max_attempts for i in ids] == [7, 7, 7]
    parents = await _rows(store, "SELECT id, parent_id FROM conveyor_tasks ORDER BY seq")
    assert [row.parent_id for row in parents[2:]] == [child, None, root]
    assert await _deliveries(store, ids[0]) == [("", None), ("g", None)]


@pytest.mark.parametrize("name", ["submit_children", "submit_children_in"])
async def test_submit_children_of_a_missing_parent_writes_nothing(
    store: TaskStore, name: str
) -> None:
    root = v.new_task_id()
    await _run(store, "submit_one", _one(root))
    ids = [v.new_task_id(), v.new_task_id()]
    rows = await _run(store, name, {**_plain(ids, ["q", "q"]), "parent_ids": [root, MISSING]})
    assert [(row.id, row.orphan) for row in rows] == [(None, MISSING)]
    assert await _count(store) == 1


@pytest.mark.parametrize("name", ["submit_child", "submit_child_in"])
async def test_submit_child_takes_its_parents_root_or_writes_nothing(
    subscribed: TaskStore, name: str
) -> None:
    store = subscribed
    root, child, grandchild = v.new_task_id(), v.new_task_id(), v.new_task_id()
    await _run(store, "submit_one", _one(root))
    (row,) = await _run(store, name, {**_one(child), "parent_id": root})
    assert (row.id, row.root_id, row.orphan, row.max_attempts) == (child, root, None, 7)
    (row,) = await _run(store, name, {**_one(grandchild), "parent_id": child})
    assert row.root_id == root
    assert await _deliveries(store, grandchild) == [("", None), ("g", None)]
    (row,) = await _run(store, name, {**_one(v.new_task_id()), "parent_id": MISSING})
    assert (row.id, row.orphan) == (None, MISSING)
    assert await _count(store) == 3


async def test_a_submit_in_a_transaction_is_undone_with_it(store: TaskStore) -> None:
    """The caller's-transaction variants write inside the transaction they run in:
    rolled back with it, nothing of them stays."""
    await store.open()
    assert store._texts is not None
    plain, one = store._texts["submit_plain_in"], store._texts["submit_one_in"]

    async def work(conn: Any) -> None:
        await texts.execute(conn, store, plain, _plain([v.new_task_id()], ["q"]))
        await texts.execute(conn, store, one, _one(v.new_task_id()))
        raise LookupError("the caller's transaction fails")

    with pytest.raises(LookupError):
        await store._run(work)
    assert await _count(store) == 0
    assert await _rows(store, "SELECT task_seq FROM conveyor_deliveries") == []


async def test_submit_context_reads_the_clock_and_the_queues_settings(
    subscribed: TaskStore,
) -> None:
    rows = await _run(subscribed, "submit_context", {"queues": ["q", "other"]})
    assert [(row.queue, row.max_attempts) for row in rows] == [("q", 7)]
    assert abs(rows[0].now - v.now_us()) < 5_000_000
    (row,) = await _run(subscribed, "submit_context", {"queues": ["other"]})
    assert (row.queue, row.max_attempts, row.backoff) == (None, None, None)
    assert row.now is not None


async def test_parent_roots_reads_the_roots_of_the_tasks_that_exist(store: TaskStore) -> None:
    root, child = v.new_task_id(), v.new_task_id()
    await _run(store, "submit_one", _one(root))
    await _run(store, "submit_child", {**_one(child), "parent_id": root})
    rows = await _run(store, "parent_roots", {"ids": [child, root, MISSING]})
    assert sorted((row.id, row.root_id) for row in rows) == sorted([(child, root), (root, root)])


async def test_insert_rows_writes_rows_in_order_and_names_the_streams_joined(
    subscribed: TaskStore,
) -> None:
    """The rows as given, in order; their delivery rows; the streams the new
    partitioned rows joined, once each (queue mode's and the group's)."""
    store = subscribed
    ids = [v.new_task_id() for _ in range(3)]
    now = v.now_us()

    def row(task_id: str, partition: str | None, key: str | None) -> list[Any]:
        return [task_id, "n", "q", partition, "{}", "{}", 0, 4, None, now, now, key, None,
                task_id, None, None]  # fmt: skip

    rows = [row(ids[0], "p", "k"), row(ids[1], None, None), row(ids[2], "p", None)]
    touched = await _run(store, "insert_rows", {"rows": json.dumps(rows)})
    assert sorted((t.queue, t.grp, t.partition) for t in touched) == [
        ("q", "", "p"),
        ("q", "g", "p"),
    ]
    assert not any(t.refused for t in touched)
    stored = await _rows(store, 'SELECT id, partition, "key", max_attempts FROM conveyor_tasks')
    assert [(r.id, r.partition, r.key, r.max_attempts) for r in stored] == [
        (ids[0], "p", "k", 4),
        (ids[1], None, None, 4),
        (ids[2], "p", None, 4),
    ]
    assert await _deliveries(store, ids[1]) == [("", None), ("g", None)]
    assert await _deliveries(store, ids[2]) == [("", "p"), ("g", "p")]


async def test_lock_streams_creates_the_missing_rows_and_leaves_the_rest(
    store: TaskStore,
) -> None:
    await store.submit("t", queue="q", partition="a")
    before = await _rows(store, "SELECT head_seq, available_at FROM conveyor_streams")
    keys = [["q", "", "a"], ["q", "", "b"], ["r", "g", "c"]]
    await _run(store, "lock_streams", {"keys": '[["q", "", "a"], ["q", "", "b"], ["r", "g", "c"]]'})
    after = await _rows(
        store,
        "SELECT queue, grp, partition, head_seq, available_at FROM conveyor_streams "
        "ORDER BY queue, grp, partition",
    )
    assert [[r.queue, r.grp, r.partition] for r in after] == keys
    assert (after[0].head_seq, after[0].available_at) == tuple(before[0])
    assert [(r.head_seq, r.available_at) for r in after[1:]] == [(None, None), (None, None)]


async def _held_by_another(backend: str, store_url: str, sql: str) -> bool:
    """Whether another connection is kept from taking ``sql``'s lock at once."""
    if backend == "sqlite":
        other = sqlite3.connect(store_url.removeprefix("sqlite:///"), timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            return "locked" in str(exc)
        finally:
            other.close()
        return False
    import psycopg

    dsn = store_url.replace("postgresql+psycopg://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(dsn) as other:
        try:
            await other.execute(sql + " FOR UPDATE NOWAIT")
        except psycopg.errors.LockNotAvailable:
            return True
    return False


@pytest.mark.parametrize(
    ("name", "params", "row"),
    [
        ("share_groups", {"queues": '["q"]'}, "SELECT 1 FROM conveyor_groups WHERE queue = 'q'"),
        (
            "lock_streams",
            {"keys": '[["q", "", "a"]]'},
            "SELECT 1 FROM conveyor_streams WHERE queue = 'q' AND partition = 'a'",
        ),
    ],
)
async def test_a_lock_statement_holds_its_rows_until_commit(
    store: TaskStore, backend: str, store_url: str, name: str, params: dict[str, Any], row: str
) -> None:
    """``share_groups`` and ``lock_streams`` hold their rows against another writer
    until the transaction ends: on Postgres the rows' lock (a ``FOR UPDATE`` of
    them waits), on SQLite the one write lock the transaction holds."""
    await store.subscribe("q", "g")
    await store.submit("t", queue="q", partition="a")
    assert store._texts is not None
    statement = store._texts[name]

    async def work(conn: Any) -> bool:
        await texts.execute(conn, store, statement, params)
        # (On SQLite this runs on the store's connection thread and never awaits.)
        return await _held_by_another(backend, store_url, row)

    assert await store._run(work)
    assert not await _held_by_another(backend, store_url, row)
