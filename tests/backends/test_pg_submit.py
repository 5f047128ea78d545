"""Postgres: every common kind of submit goes to the server as one statement or as
statements sent together (keys claimed and locked first, then groups, then
streams), not as a transaction of one round trip per statement through
SQLAlchemy; in the caller's transaction, the same statements run there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncConnection
from tests._support import pg_round_trips, pg_texts, scratch_pg_database

import conveyor
from conveyor import AlreadyExists
from conveyor.store.base import TaskStore
from conveyor.store.postgres import listen as pg_listen
from conveyor.store.protocol import texts


@pytest.fixture
def db(pg_url: str) -> Iterator[str]:
    with scratch_pg_database("conveyor_keyed") as url:
        yield url


async def test_a_keyed_submit_is_two_statements_sent_together(db: str) -> None:
    """Won, reused, refused: each one steps run of two statements, nothing through
    SQLAlchemy; the task is the one the store reads back, and the key made one task
    (before: a transaction of several round trips)."""
    async with conveyor.connect(db, listen=False) as st:
        await st.submit("t", queue="q")  # plans and connections, before counting
        with pg_round_trips(st) as (runs, seen):
            first = await st.submit("t", {"n": 1}, queue="q", key="k1", priority=2)
            again = await st.submit("t", {"n": 2}, queue="q", key="k1")
            with pytest.raises(AlreadyExists) as refused:
                await st.submit("t", {"n": 3}, queue="q", key="k1", conflict="reject")
        assert runs == [2, 2, 2] and seen == []
        assert refused.value.task_id == first.id and refused.value.key == "k1"
        assert first == again == await st.get(first.id)
        assert (first.key, first.payload, first.priority) == ("k1", {"n": 1}, 2)
        assert first.status is conveyor.Status.QUEUED
        [stats] = await st.stats("q")
        assert stats.counts["queued"] == 2


async def test_a_key_whose_holder_went_meanwhile_is_tried_again_step_by_step(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two statements find the key held, and its holder gone by the time it is
    read (retention between them): the submit goes the step-by-step way and makes
    the task under the key."""
    dsn = db.replace("postgresql+psycopg://", "postgresql://")
    async with conveyor.connect(db, listen=False) as st:
        holder = await st.submit("t", queue="q", key="k")
        real = texts.together

        async def holder_gone(*args: Any, **kwargs: Any) -> list[Any]:
            rows = await real(*args, **kwargs)
            assert [row.id for row in rows] == [holder.id]
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DELETE FROM conveyor_keys WHERE key = 'k'")
            return []

        monkeypatch.setattr(texts, "together", holder_gone)
        task = await st.submit("t", {"n": 2}, queue="q", key="k")
        monkeypatch.undo()
        assert task.id != holder.id and task.key == "k"
        assert await st.get_by_key("k") == task == await st.get(task.id)


async def test_a_keyed_child_is_two_statements_sent_together(db: str) -> None:
    """A child with a key, won, reused and refused: each one steps run of two
    statements, nothing through SQLAlchemy (before: a transaction of a round trip
    per step); the answer is the task the store reads back, with its parent's
    root, and the key made one task."""
    async with conveyor.connect(db, listen=False) as st:
        root = await st.submit("root", queue="q")
        middle = await st.submit("middle", queue="q", parent=root)
        await st.submit("warm", queue="q", parent=root, key="warm")  # plans, connections
        with pg_round_trips(st) as (runs, seen):
            first = await st.submit("t", {"n": 1}, queue="q", parent=middle, key="k", priority=2)
            again = await st.submit("t", {"n": 2}, queue="q", parent=root, key="k")
            with pytest.raises(AlreadyExists) as refused:
                await st.submit("t", queue="q", parent=root, key="k", conflict="reject")
        assert runs == [2, 2, 2] and seen == []
        assert refused.value.task_id == first.id
        assert first == again == await st.get(first.id) == await st.get_by_key("k")
        assert (first.parent_id, first.root_id, first.key) == (middle.id, root.id, "k")
        assert (first.payload, first.priority) == ({"n": 1}, 2)
        [stats] = await st.stats("q")
        assert stats.counts["queued"] == 4


async def test_a_keyed_child_of_a_missing_parent_writes_nothing(db: str) -> None:
    """The parent is not a task: the error names it, no task is written and the
    key stays free (claimed in the statement that would write the child, it
    would name a task that does not exist); a later submit takes the key."""
    async with conveyor.connect(db, listen=False) as st:
        root = await st.submit("root", queue="q")
        missing = "01ARZ3NDEKTSV4RRFFQ69G5FAZ"
        with pytest.raises(conveyor.InvalidArgument) as bad:
            await st.submit("t", queue="q", parent=missing, key="k")
        assert bad.value.field == "parent" and missing in str(bad.value)
        assert await st.get_by_key("k") is None
        [stats] = await st.stats("q")
        assert stats.counts["queued"] == 1
        task = await st.submit("t", queue="q", parent=root, key="k")
        assert await st.get_by_key("k") == task and task.root_id == root.id


async def test_a_keyed_partitioned_submit_is_eight_statements_sent_together(db: str) -> None:
    """A partitioned task with a key, won, reused and refused: each one steps run of
    eight statements, nothing through SQLAlchemy (before: a transaction of a round
    trip per step). Its stream keeps submit order around it, for queue mode and a
    group; the refused submit wrote nothing."""
    async with conveyor.connect(db, listen=False) as st:
        await st.subscribe("q", "g")
        await st.submit("t", queue="q", partition="warm", key="warm")  # plans, connections
        before = await st.submit("t", {"n": 0}, queue="q", partition="p")
        with pg_round_trips(st) as (runs, seen):
            first = await st.submit("t", {"n": 1}, queue="q", partition="p", key="k")
            again = await st.submit("t", {"n": 2}, queue="q", partition="other", key="k")
            with pytest.raises(AlreadyExists) as refused:
                await st.submit("t", queue="q", partition="p", key="k", conflict="reject")
        assert runs == [8, 8, 8] and seen == []
        assert refused.value.task_id == first.id
        assert first == again == await st.get(first.id) == await st.get_by_key("k")
        assert (first.partition, first.key, first.payload) == ("p", "k", {"n": 1})
        after = await st.submit("t", {"n": 3}, queue="q", partition="p")
        for group in (None, "g"):
            assert await _drained(st, "p", group) == [before.id, first.id, after.id]


async def test_a_replace_is_statements_sent_together(db: str) -> None:
    """A replace, of a partitioned holder in queue mode and a group, and of a key
    nobody holds: each one steps run (nine statements, eleven with a partition),
    nothing through SQLAlchemy (before: a transaction of a round trip per step).
    The holder is cancelled for queue mode and the group, the task behind it in
    its stream becomes the stream's head, and the key names the new task."""
    async with conveyor.connect(db, listen=False) as st:
        await st.subscribe("q", "g")
        await st.submit("t", queue="q", key="warm", conflict="replace")  # plans, connections
        old = await st.submit("t", {"n": 0}, queue="q", partition="p", key="k")
        behind = await st.submit("t", {"n": 1}, queue="q", partition="p")
        with pg_round_trips(st) as (runs, seen):
            new = await st.submit("t", {"n": 2}, queue="q", key="k", conflict="replace")
            newer = await st.submit(
                "t", {"n": 3}, queue="q", partition="p2", key="k", conflict="replace"
            )
            fresh = await st.submit("t", queue="q", key="fresh", conflict="replace")
        assert runs == [9, 11, 9] and seen == []
        for group in (None, "g"):
            assert (await st.get(old.id, group=group)).status is conveyor.Status.CANCELLED
            assert (await st.get(new.id, group=group)).status is conveyor.Status.CANCELLED
            got = await st.claim("q", worker_id="w", group=group, partition="p")
            assert [t.id for t in got] == [behind.id]
        assert newer == await st.get_by_key("k")
        assert (newer.partition, newer.payload) == ("p2", {"n": 3})
        assert newer.status is conveyor.Status.QUEUED
        assert fresh == await st.get_by_key("fresh")


async def test_a_replace_announces_the_holder_to_its_waiters(db: str) -> None:
    """A wait() on the holder is registered: the replace announces the holder on
    the channel of finished tasks (heard here by a connection of its own), and
    the wait() returns it cancelled."""
    dsn = db.replace("postgresql+psycopg://", "postgresql://")
    async with conveyor.connect(db) as st:
        holder = await st.submit("t", queue="q", key="k")
        waiting = asyncio.ensure_future(st.wait(holder.id, timeout=10))
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as ear:
            await ear.execute(f"LISTEN {pg_listen.DONE_CHANNEL}")
            await asyncio.sleep(0.3)  # the wait() has registered
            await st.submit("t", queue="q", key="k", conflict="replace")
            heard = [n.payload async for n in ear.notifies(timeout=5, stop_after=1)]
        assert heard == [holder.id]
        assert (await waiting).status is conveyor.Status.CANCELLED


async def test_children_are_submitted_in_one_statement(db: str) -> None:
    """A child alone, and a batch of children and tasks without a parent: each one
    statement of the store's own, nothing through SQLAlchemy (before: a
    transaction of a statement per step); each answer is the task the store reads
    back, with its parent and its parent's root (a grandchild: the root's id)."""
    async with conveyor.connect(db, listen=False) as st:
        root = await st.submit("root", queue="q")
        await st.submit("warm", queue="q", parent=root)  # plans and connections
        with pg_round_trips(st) as (runs, seen):
            child = await st.submit("child", {"n": 1}, queue="q", parent=root, priority=3)
            batch = await st.submit_many(
                [
                    {"name": "grandchild", "queue": "q", "parent": child.id},
                    {"name": "alone", "queue": "q"},
                    {"name": "sibling", "queue": "other", "parent": root.id, "delay": 60},
                ]
            )
        assert runs == [] and seen == []
        assert (child.parent_id, child.root_id, child.priority) == (root.id, root.id, 3)
        grandchild, alone, sibling = batch
        assert (grandchild.parent_id, grandchild.root_id) == (child.id, root.id)
        assert (alone.parent_id, alone.root_id) == (None, alone.id)
        assert (sibling.parent_id, sibling.root_id) == (root.id, root.id)
        for task in (child, *batch):
            assert task == await st.get(task.id)
        assert {t.id for t in await st.children(root.id)} >= {child.id, sibling.id}


async def test_partitioned_children_are_statements_sent_together(db: str) -> None:
    """A partitioned child alone, and a batch of partitioned children and plain
    tasks: each one steps run of five statements, nothing through SQLAlchemy
    (before: a transaction of a round trip per step). Each answer is the task the
    store reads back, with its parent's root; the children keep their streams'
    order, in queue mode and a group."""
    async with conveyor.connect(db, listen=False) as st:
        await st.subscribe("q", "g")
        root = await st.submit("root", queue="q")
        middle = await st.submit("middle", queue="q", parent=root)
        await st.submit("warm", queue="q", parent=root, partition="warm")  # plans, connections
        with pg_round_trips(st) as (runs, seen):
            one = await st.submit("c", {"n": 0}, queue="q", parent=middle, partition="p")
            batch = await st.submit_many(
                [
                    {"name": "c", "queue": "q", "parent": root.id, "partition": f"p{i % 2}"}
                    for i in range(1, 5)
                ]
                + [{"name": "plain", "queue": "q"}]
            )
        assert runs == [5, 5] and seen == []
        assert (one.parent_id, one.root_id, one.partition) == (middle.id, root.id, "p")
        for task in (one, *batch):
            assert task == await st.get(task.id)
        assert [t.root_id for t in batch] == [root.id] * 4 + [batch[4].id]
        for group in (None, "g"):
            assert await _drained(st, "p0", group) == [batch[1].id, batch[3].id]


async def test_partitioned_children_of_a_missing_parent_write_nothing(db: str) -> None:
    """One unknown parent in a batch of partitioned children: the error names it,
    and neither a task nor a stream of the batch is written."""
    dsn = db.replace("postgresql+psycopg://", "postgresql://")
    async with conveyor.connect(db, listen=False) as st:
        await st.subscribe("q", "g")
        root = await st.submit("root", queue="q")
        missing = "01ARZ3NDEKTSV4RRFFQ69G5FAZ"
        with pytest.raises(conveyor.InvalidArgument) as bad:
            await st.submit_many(
                [
                    {"name": "ok", "queue": "q", "parent": root.id, "partition": "new"},
                    {"name": "lost", "queue": "q", "parent": missing, "partition": "new"},
                ]
            )
        assert bad.value.field == "parent" and missing in str(bad.value)
        [stats] = await st.stats("q")
        assert stats.counts["queued"] == 1
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute("SELECT count(*) FROM conveyor_streams")
            assert await cur.fetchone() == (0,)


async def test_children_of_a_missing_parent_write_nothing(db: str) -> None:
    """One unknown parent in a batch: the error names it and no task of the batch
    is written, in one statement as well."""
    async with conveyor.connect(db, listen=False) as st:
        root = await st.submit("root", queue="q")
        with pg_round_trips(st) as (runs, seen):
            with pytest.raises(conveyor.InvalidArgument) as bad:
                await st.submit_many(
                    [
                        {"name": "ok", "queue": "q", "parent": root.id},
                        {"name": "lost", "queue": "q", "parent": "01ARZ3NDEKTSV4RRFFQ69G5FAZ"},
                        {"name": "plain", "queue": "q"},
                    ]
                )
        assert runs == [] and seen == []
        assert bad.value.field == "parent" and "01ARZ3NDEKTSV4RRFFQ69G5FAZ" in str(bad.value)
        [stats] = await st.stats("q")
        assert stats.counts["queued"] == 1  # the root alone


async def test_a_keyed_batch_is_statements_sent_together(db: str) -> None:
    """A batch with keys ("reuse"), without and with partitions: one steps run
    each (four statements, eight with partitions), nothing through SQLAlchemy
    (before: a transaction of a round trip per step). New keys make new tasks,
    held ones answer with their holder, a key twice in the batch makes one task,
    in request order; partitioned tasks keep their streams' order."""
    async with conveyor.connect(db, listen=False) as st:
        await st.subscribe("q", "g")
        held = await st.submit_many([{"name": "t", "queue": "q", "key": f"k{i}"} for i in range(3)])
        await st.submit_many([{"name": "t", "queue": "q", "key": "w", "partition": "w"}] * 2)
        with pg_round_trips(st) as (runs, seen):
            batch = await st.submit_many(
                [{"name": "t", "queue": "q", "key": f"k{i}"} for i in range(1, 6)]
                + [{"name": "t", "queue": "q", "key": "k5"}, {"name": "t", "queue": "q"}]
            )
            streamed = await st.submit_many(
                [
                    {"name": "t", "queue": "q", "key": f"s{i % 3}", "partition": f"p{i % 2}"}
                    for i in range(6)
                ]
                + [{"name": "t", "queue": "q", "partition": "p0", "payload": {"last": True}}]
            )
        assert runs == [4, 8] and seen == []
        assert [t.id for t in batch[:2]] == [held[1].id, held[2].id]
        assert len({t.id for t in batch[2:5]}) == 3 and batch[5].id == batch[4].id
        for i, task in enumerate(batch[:5], start=1):
            assert task.key == f"k{i}"
            assert await st.get_by_key(f"k{i}") == task == await st.get(task.id)
        assert batch[6].key is None and batch[6] == await st.get(batch[6].id)
        assert [t.id for t in streamed[3:6]] == [t.id for t in streamed[:3]]
        assert [t.partition for t in streamed[:3]] == ["p0", "p1", "p0"]
        [stats] = await st.stats("q")
        assert stats.counts["queued"] == 3 + 1 + 3 + 1 + 3 + 1
        for group in (None, "g"):
            assert await _drained(st, "p0", group) == [
                streamed[0].id,
                streamed[2].id,
                streamed[6].id,
            ]


async def test_a_key_of_a_batch_whose_holder_went_meanwhile_is_submitted_again(db: str) -> None:
    """A batch finds key "k" held; before it locks the key (a connection of its own
    holds the key row), the key row is deleted (retention): the batch's request
    for "k" was not written, and goes again the usual way, so "k" makes a task,
    the rest of the batch is written once, and the answers are the stored tasks."""
    dsn = db.replace("postgresql+psycopg://", "postgresql://")
    async with conveyor.connect(db, listen=False) as st:
        gone = await st.submit("t", queue="q", key="k")
        async with await psycopg.AsyncConnection.connect(dsn) as retention:
            await retention.execute("SELECT 1 FROM conveyor_keys WHERE key = 'k' FOR UPDATE")
            with pg_round_trips(st) as (runs, _):
                batch = asyncio.ensure_future(
                    st.submit_many(
                        [
                            {"name": "t", "queue": "q", "key": "a"},
                            {"name": "t", "queue": "q", "key": "k", "payload": {"n": 1}},
                            {"name": "t", "queue": "q"},
                        ]
                    )
                )
                await _lock_waiters(dsn, 1)
                await retention.execute("DELETE FROM conveyor_keys WHERE key = 'k'")
                await retention.commit()
                a, k, plain = await asyncio.wait_for(batch, 10)
        assert runs[0] == 4  # sent together first; "k" then went step by step
        assert k.id != gone.id and k.payload == {"n": 1}
        assert await st.get_by_key("k") == k == await st.get(k.id)
        assert await st.get_by_key("a") == a and plain == await st.get(plain.id)
        [stats] = await st.stats("q")
        assert stats.counts["queued"] == 4


async def _lock_waiters(dsn: str, n: int) -> None:
    """Return once ``n`` backends of this database wait on a lock."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for _ in range(200):
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cur.fetchone()
            if row is not None and row[0] >= n:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {n} lock waiters")


async def test_a_refusing_keyed_batch_claims_and_locks_its_keys_with_built_statements(
    db: str,
) -> None:
    """A batch with keys and conflict "reject" goes step by step (one refused key
    must leave the whole batch unwritten), but its keys are claimed and their
    holders locked by statements built once, from arrays: nothing through
    SQLAlchemy builds a statement of conveyor_keys (before: a multi-row VALUES of
    two placeholders per key, parsed anew on every call)."""
    async with conveyor.connect(db, listen=False) as st:
        held = await st.submit_many([{"name": "t", "queue": "q", "key": f"k{i}"} for i in range(3)])
        with pg_round_trips(st) as (_runs, seen):
            with pytest.raises(AlreadyExists) as refused:
                await st.submit_many(
                    [
                        {"name": "t", "queue": "q", "key": f"k{i}", "conflict": "reject"}
                        for i in range(2, 6)
                    ]
                )
        built = pg_texts()
        keyed = [s for s in seen if "conveyor_keys" in s]
        assert keyed == [built["claim_keys"], built["lock_keys"]]
        assert refused.value.key == "k2" and refused.value.task_id == held[2].id
        assert await st.get_by_key("k3") is None
        [stats] = await st.stats("q")
        assert stats.counts["queued"] == 3


async def test_a_step_by_step_submit_reads_its_context_with_built_statements(db: str) -> None:
    """A partitioned child with a key goes step by step; the active groups
    shared, its stream locked, the clock and queue settings read and the new work
    announced are statements built once (before: SQLAlchemy built each anew on
    every call). The task takes its queue's settings."""
    async with conveyor.connect(db) as st:
        await st.configure_queue("q", max_attempts=7)
        await st.subscribe("q", "audit")
        root = await st.submit("root", queue="q")
        await st.submit("t", queue="q", key="warm", partition="p", parent=root)
        with pg_round_trips(st) as (_runs, seen):
            task = await st.submit("t", queue="q", key="k", partition="p", parent=root)
        built = pg_texts()
        for name in ("share_groups", "lock_streams", "submit_context", "wake.notify"):
            assert built[name] in seen
        others = [s for s in seen if s not in built.values()]
        words = ("groups", "streams", "queues", "notify")
        assert [s for s in others if any(w in s for w in words)] == []
        assert (task.max_attempts, task.partition, task.key) == (7, "p", "k")
        assert await st.get(task.id, group="audit") is not None


async def test_a_submit_in_the_callers_transaction_is_one_statement(db: str) -> None:
    """In the caller's transaction, a plain task, a batch and a child each go as
    the one-statement submit on the caller's connection, with no savepoint (before:
    a savepoint, then a statement per step through SQLAlchemy); the answers are
    what the store reads back once the caller commits."""
    async with conveyor.connect(db, listen=False) as st:
        root = await st.submit("root", queue="q")
        async with _callers_connection(st, db) as (conn, seen):
            one = await st.submit("t", {"n": 1}, queue="q", connection=conn)
            batch = await st.submit_many(
                [{"name": "t", "queue": "q"}, {"name": "t", "queue": "other"}],
                connection=conn,
            )
            child = await st.submit("c", queue="q", parent=root, connection=conn)
            await conn.commit()
        built = pg_texts()
        names = ["submit_one_in", "submit_plain_in", "submit_child_in"]
        assert seen == [built[name] for name in names]
        for task in (one, *batch, child):
            assert task == await st.get(task.id)
        assert child.root_id == root.id


async def test_keyed_submits_in_the_callers_transaction_run_the_built_statements(
    db: str,
) -> None:
    """In the caller's transaction, a keyed submit and a keyed partitioned one run
    the statements they are sent together as outside it, one after another on the
    caller's connection in a savepoint (before: a statement per step through
    SQLAlchemy), their variants for a caller's transaction: until the caller
    commits, it holds no lock of the listeners' (a listener starting meanwhile
    would wait for it)."""
    dsn = db.replace("postgresql+psycopg://", "postgresql://")
    async with conveyor.connect(db, listen=False) as st:
        async with _callers_connection(st, db) as (conn, seen):
            keyed = await st.submit("t", queue="q", key="k", connection=conn)
            streamed = await st.submit("t", queue="q", key="s", partition="p", connection=conn)
            async with await psycopg.AsyncConnection.connect(dsn) as other:
                cur = await other.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND objid = %s AND granted AND database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())",
                    [pg_listen.LISTENING_LOCK],
                )
                assert await cur.fetchone() == (0,)
            await conn.commit()
        built = pg_texts()
        own = [s for s in seen if "SAVEPOINT" not in s]
        assert own[:2] == [built["submit_keyed_in"], built["key_holder"]]
        assert own[2:] == [
            built[name]
            for name in (
                "claim_keys",
                "lock_keys",
                "share_groups",
                "lock_streams",
                "submit_keyed_partitioned_in",
                "lock_group_streams",
                "refresh_group_streams",
                "key_holder",
            )
        ]
        assert len(seen) - len(own) == 4  # a savepoint and its release, each
        assert await st.get_by_key("k") == keyed == await st.get(keyed.id)
        assert await st.get_by_key("s") == streamed and streamed.partition == "p"


@asynccontextmanager
async def _callers_connection(
    st: TaskStore, db: str
) -> AsyncIterator[tuple[AsyncConnection, list[str]]]:
    """A caller's connection to ``db`` in a transaction (checked once, by a first
    submit in it), and every statement it runs from then on."""
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(db)
    seen: list[str] = []

    def count(*args: Any) -> None:
        seen.append(args[2])

    try:
        async with engine.connect() as conn:
            await st.submit("warm", queue="w", connection=conn)
            event.listen(engine.sync_engine, "before_cursor_execute", count)
            yield conn, seen
    finally:
        if event.contains(engine.sync_engine, "before_cursor_execute", count):
            event.remove(engine.sync_engine, "before_cursor_execute", count)
        await engine.dispose()


async def _drained(st: TaskStore, partition: str, group: str | None) -> list[str]:
    """The ids of queue "q"'s ``partition``, claimed and acknowledged one after
    another (as ``group``, or queue mode) until none is left: the stream's order."""
    order: list[str] = []
    while got := await st.claim("q", worker_id="w", group=group, partition=partition):
        order += [t.id for t in got]
        await st.ack_many([{"task_id": t.id, "worker_id": "w", "group": group} for t in got])
    return order
