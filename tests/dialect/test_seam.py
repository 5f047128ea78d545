"""The dialect seam, each method alone, on both backends.

Every abstract method of :class:`conveyor.store.seam.Seam` is exercised here
against a real database through the store's own engine, checking the contract
its docstring states — not the protocol built on top of it (that is
``tests/conformance``). A new dialect passes this file first.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

import conveyor
from conveyor.schema import counts as cn
from conveyor.schema import deliveries as d
from conveyor.schema import tasks as t
from conveyor.store.base import TaskStore
from conveyor.store.protocol import codec
from conveyor.store.protocol import queries as q

SETTLE = 0.3  # seconds a blocked transaction is given to (wrongly) get through


async def _conn(store: TaskStore, *, write: bool = True) -> AsyncConnection:
    await store.open()
    assert store._engine is not None
    conn = await store._engine.connect()
    return await conn.execution_options(conveyor_write=write)


# ------------------------------------------------------------------ clock
async def test_db_now_is_wall_clock_microseconds(store: TaskStore) -> None:
    before = time.time()
    now = await store._run(lambda conn: store._current_now_us(conn), write=False)
    after = time.time()
    # Postgres reads the server's clock: same host here, so within a second.
    assert before - 1 <= now / 1e6 <= after + 1


async def test_db_now_is_stable_within_a_statement(store: TaskStore) -> None:
    clock = store._db_now()

    async def work(conn: AsyncConnection) -> tuple[int, int]:
        row = (await conn.execute(select(clock.label("a"), clock.label("b")))).one()
        return int(row.a), int(row.b)

    a, b = await store._run(work, write=False)
    assert a == b


async def test_db_now_never_goes_back_between_transactions(store: TaskStore) -> None:
    readings = [
        await store._run(lambda conn: store._current_now_us(conn), write=False) for _ in range(5)
    ]
    assert readings == sorted(readings)


# -------------------------------------------------------------- engine
async def test_reader_runs_beside_a_writer(store: TaskStore) -> None:
    """A write transaction in progress does not block a read transaction."""
    writer = await _conn(store)
    reader = await _conn(store, write=False)
    try:
        await writer.begin()
        await writer.execute(store._upsert(cn).values(queue="q", grp="", status="x", n=1))
        await reader.begin()
        seen = await asyncio.wait_for(reader.execute(select(cn.c.n)), 5)
        assert list(seen) == []  # not committed yet
        await reader.rollback()
        await writer.commit()
    finally:
        await writer.close()
        await reader.close()


async def _pause(seconds: float) -> None:
    """Hold a transaction open for ``seconds``. A SQLite store runs the whole
    transaction as one blocking function on its connection thread, where there is
    no event loop: there the pause blocks that thread (other stores' threads run)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        time.sleep(seconds)
    else:
        await asyncio.sleep(seconds)


async def test_two_writers_never_fail_on_lock_upgrade(store: TaskStore, store_url: str) -> None:
    """Read-then-write transactions of two connections both commit (one waits)."""

    async def bump(conn: AsyncConnection) -> None:
        n = (await conn.execute(select(cn.c.n).where(cn.c.queue == "q"))).scalar()
        await _pause(0.05)
        await conn.execute(update(cn).where(cn.c.queue == "q").values(n=(n or 0) + 1))

    await store._run(
        lambda conn: conn.execute(store._upsert(cn).values(queue="q", grp="", status="x", n=0))
    )
    # Two stores: two connections, whatever a store does with its own.
    async with conveyor.connect(store_url) as other:
        await asyncio.gather(store._run(bump), other._run(bump))
    total = await store._run(lambda conn: _scalar(conn, select(cn.c.n)), write=False)
    assert total in (1, 2)  # Postgres may let both read 0; neither may fail


async def _scalar(conn: AsyncConnection, stmt: Any) -> Any:
    return (await conn.execute(stmt)).scalar()


# ------------------------------------------------------------- locking
async def _seed(store: TaskStore, n: int) -> list[int]:
    tasks = await store.submit_many([{"name": "t", "queue": "q"} for _ in range(n)])
    seqs = await store._run(
        lambda conn: codec.fetch_tasks(conn, q.QUEUE_MODE, ids=[x.id for x in tasks])
    )
    assert len(seqs) == n

    async def order(conn: AsyncConnection) -> list[int]:
        rows = await conn.execute(select(t.c.seq).order_by(t.c.seq))
        return list(rows.scalars())

    return await store._run(order, write=False)


async def test_lock_candidates_never_hands_one_row_to_two(store: TaskStore) -> None:
    first_seq, second_seq = await _seed(store, 2)
    now = store._now()
    pick = store._lock_candidates(q.ready_plain(q.QUEUE_MODE, ["q"], now).limit(1))
    a = await _conn(store)
    b = await _conn(store)
    try:
        await a.begin()
        got_a = (await a.execute(pick)).scalar()
        assert got_a == first_seq

        async def other() -> Any:
            await b.begin()
            got = (await b.execute(pick)).scalar()
            await b.commit()
            return got

        later = asyncio.create_task(other())
        await asyncio.sleep(SETTLE)
        await a.execute(update(d).where(d.c.task_seq == got_a).values(status="running"))
        await a.commit()
        got_b = await asyncio.wait_for(later, 10)
        assert got_b == second_seq
    finally:
        await a.close()
        await b.close()


async def test_lock_rows_holds_writers_until_commit(store: TaskStore) -> None:
    [seq] = await _seed(store, 1)
    locked = store._lock_rows(select(d.c.status).where(d.c.task_seq == seq))
    a = await _conn(store)
    try:
        await a.begin()
        assert (await a.execute(locked)).scalar() == "queued"
        done = asyncio.Event()

        async def writer(conn: AsyncConnection) -> None:
            await conn.execute(update(d).where(d.c.task_seq == seq).values(priority=5))

        async def other() -> None:
            await store._run(writer)
            done.set()

        later = asyncio.create_task(other())
        await asyncio.sleep(SETTLE)
        assert not done.is_set(), "a write got past a row lock"
        await a.commit()
        await asyncio.wait_for(later, 10)
    finally:
        await a.close()


async def test_backfill_barrier_holds_producers_back(store: TaskStore) -> None:
    a = await _conn(store)
    try:
        await a.begin()
        await store._lock_for_backfill(a)
        submitted = asyncio.create_task(store.submit("t", queue="q"))
        await asyncio.sleep(SETTLE)
        assert not submitted.done(), "a producer got past the backfill barrier"
        await a.commit()
        await asyncio.wait_for(submitted, 10)
    finally:
        await a.close()


async def test_migration_lock_serialises(store: TaskStore) -> None:
    a = await _conn(store)
    b = await _conn(store)
    try:
        await a.begin()
        await a.run_sync(store._lock_for_migration)
        entered = asyncio.Event()

        async def other() -> None:
            await b.begin()
            await b.run_sync(store._lock_for_migration)
            entered.set()
            await b.commit()

        later = asyncio.create_task(other())
        await asyncio.sleep(SETTLE)
        assert not entered.is_set(), "two migrations ran at once"
        await a.commit()
        await asyncio.wait_for(later, 10)
    finally:
        await a.close()
        await b.close()


async def test_maintenance_lock_lets_at_most_one_collide(store: TaskStore, backend: str) -> None:
    async with store._maintenance_lock() as first:
        assert first is True
        async with store._maintenance_lock() as second:
            # Postgres passes could collide: the second caller skips. SQLite's passes
            # are serialised by its write lock, so both may proceed.
            assert second is (backend == "sqlite")
    async with store._maintenance_lock() as again:
        assert again is True


async def test_transaction_gate_lets_other_transactions_through(store: TaskStore) -> None:
    """Both dialects order their transactions elsewhere (the server; SQLite's
    connection thread), so the gate returns at once: a second attempt gets through
    while one holds it, and a whole transaction, its own gate included, commits."""
    order: list[str] = []
    async with store._transaction_gate(True):
        order.append("first in")

        async def second() -> None:
            async with store._transaction_gate(False):
                order.append("second in")

        await asyncio.wait_for(second(), timeout=10)  # only guards against a hang

        async def write(conn: AsyncConnection) -> int:
            await conn.execute(cn.insert().values(queue="q", grp="", status="x", n=1))
            return int((await conn.execute(select(cn.c.n))).scalar_one())

        assert await asyncio.wait_for(store._run(write), timeout=10) == 1
        order.append("first out")
    assert order == ["first in", "second in", "first out"]


async def test_in_memory_gate_queues_transactions_in_order() -> None:
    async with conveyor.connect("sqlite:///:memory:") as st:
        order: list[int] = []

        async def work(i: int) -> None:
            async def body(conn: AsyncConnection) -> None:
                order.append(i)
                await _pause(0.01)
                await conn.execute(text("SELECT 1"))

            await st._run(body)

        await asyncio.gather(*(work(i) for i in range(5)))
        assert order == list(range(5))


# --------------------------------------------------- error classification
async def _error(store: TaskStore, sql: str) -> DBAPIError:
    conn = await _conn(store)
    try:
        with pytest.raises(DBAPIError) as info:
            async with conn.begin():
                await conn.execute(text(sql))
    finally:
        await conn.close()
    return info.value


async def test_is_transient(store: TaskStore, backend: str, store_url: str) -> None:
    assert store._is_transient(await _error(store, "SELEC 1")) is False
    if backend == "postgres":
        for state in ("40001", "40P01"):
            raised = await _error(
                store, f"DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '{state}'; END $$"
            )
            assert store._is_transient(raised) is True
        return
    # SQLite: another connection holds the write lock and this one will not wait.
    impatient = conveyor.connect(store_url, busy_timeout=0)
    await impatient.open()
    holder = await _conn(store)
    try:
        await holder.begin()
        await holder.execute(store._upsert(cn).values(queue="q", grp="", status="x", n=1))
        conn = await _conn(impatient)
        try:
            with pytest.raises(DBAPIError) as busy:
                async with conn.begin():
                    pass
        finally:
            await conn.close()
        await holder.rollback()
    finally:
        await holder.close()
        await impatient.close()
    assert impatient._is_transient(busy.value) is True


# ------------------------------------------------------------ statements
async def test_upsert_does_nothing_or_updates(store: TaskStore) -> None:
    async def work(conn: AsyncConnection) -> list[int]:
        ins = store._upsert(cn).values(queue="q", grp="", status="x", n=1)
        await conn.execute(ins.on_conflict_do_nothing(index_elements=["queue", "grp", "status"]))
        await conn.execute(ins.on_conflict_do_nothing(index_elements=["queue", "grp", "status"]))
        first = (await conn.execute(select(cn.c.n))).scalar_one()
        await conn.execute(
            ins.on_conflict_do_update(
                index_elements=["queue", "grp", "status"], set_={"n": cn.c.n + 5}
            )
        )
        second = (await conn.execute(select(cn.c.n))).scalar_one()
        return [first, second]

    assert await store._run(work) == [1, 6]


async def test_returning_view_returns_the_task_as_the_view_reads_it(store: TaskStore) -> None:
    task = await store.submit("t", {"a": 1}, queue="q", key="k1", metadata={"m": 2})

    async def work(conn: AsyncConnection) -> tuple[Any, Any]:
        stmt = store._returning_view(
            update(d)
            .where(d.c.task_seq == q.task_seq_of(task.id), d.c.grp == q.QUEUE_MODE)
            .values(priority=d.c.priority)
        )
        rows = list(await conn.execute(stmt))
        fetched = await codec.fetch_tasks(conn, q.QUEUE_MODE, ids=[task.id])
        return rows, fetched

    rows, fetched = await store._run(work)
    assert len(rows) == 1
    names = {c.name for c in q.view_columns()}
    assert names <= set(rows[0]._mapping)
    assert codec.row_to_task(rows[0]) == fetched[task.id]


async def test_claim_probe_is_none_or_says_whether_work_is_there(
    store: TaskStore, backend: str
) -> None:
    probe = store._claim_probe(q.QUEUE_MODE, ["q"], None)
    if backend == "postgres":
        # Its claims go straight in (an idle claim takes no lock worth sparing).
        assert probe is None
        return
    assert probe is not None

    async def ask(conn: AsyncConnection) -> bool:
        assert probe is not None
        return any((await conn.execute(probe)).one())

    assert await store._run(ask, write=False) is False
    await store.submit("t", queue="q")
    probe = store._claim_probe(q.QUEUE_MODE, ["q"], None)
    assert await store._run(ask, write=False) is True


# ---------------------------------------------------------- wake channel
async def test_notify_reaches_other_stores_only_on_commit(
    store: TaskStore, store_url: str, backend: str
) -> None:
    async with conveyor.connect(store_url) as other:
        await other.open()
        await asyncio.sleep(0.2)  # let a listener settle

        async def rolled_back(conn: AsyncConnection) -> None:
            await store._notify(conn, ["q"], done=False)
            raise RuntimeError("roll back")

        with pytest.raises(RuntimeError):
            await store._run(rolled_back)
        assert await other.wait_for_work(["q"], SETTLE) is False

        await store._run(lambda conn: store._notify(conn, ["q"], done=False))
        woke = await other.wait_for_work(["q"], 3)
        # SQLite has no cross-process channel: its waiters poll.
        assert woke is (backend == "postgres")


async def test_the_wake_channel_starts_again_after_a_close(store_url: str, backend: str) -> None:
    """close() stops the channel and the next opening starts it anew: in each of two
    openings, an announcement another store commits reaches this one (on Postgres;
    SQLite has no cross-process channel, its waiters poll), and after each close
    nothing of the channel is left."""
    st = conveyor.connect(store_url)
    async with conveyor.connect(store_url) as other:
        for _ in range(2):
            await st.open()
            assert await st.wait_for_work(["q"], 0) is False  # starts the channel
            assert st._wake_start is not None and st._wake_start.done()
            await other._run(lambda conn: other._notify(conn, ["q"], done=False))
            woke = await st.wait_for_work(["q"], 3)
            assert woke is (backend == "postgres")
            await st.close()
            assert st._wake_start is None
            assert getattr(st, "_listener", None) is None


# ----------------------------------------------------------- statistics
async def test_refresh_statistics_has_nothing_to_do_on_sqlite(tmp_path: Any) -> None:
    async with conveyor.connect(f"sqlite:///{tmp_path / 'stats.db'}") as st:
        await st.submit_many([{"name": "t", "queue": "q"} for _ in range(200)])
        conn = await _conn(st)
        async with conn.begin():
            assert await st._refresh_statistics(conn) == []
        await conn.close()


async def _analysed(conn: AsyncConnection) -> set[str]:
    rows = await conn.execute(
        text("SELECT DISTINCT tablename FROM pg_stats WHERE tablename LIKE 'conveyor%'")
    )
    found = {row.tablename for row in rows}
    await conn.commit()
    return found


async def test_refresh_statistics_analyses_changed_tables_once(pg_url: str) -> None:
    """Postgres: tables never analysed (or changed past autovacuum's threshold) get
    planner statistics, and a second call finds nothing left to do."""
    from tests._support import scratch_pg_database

    with scratch_pg_database("conveyor_stats") as url:
        async with conveyor.connect(url, listen=False) as st:
            await st.submit_many([{"name": "t", "queue": "q"} for _ in range(1000)])
        # Closing the store's connections reported their inserts to the statistics.
        async with conveyor.connect(url, listen=False) as st:
            conn = await _conn(st)
            assert await _analysed(conn) == set()
            async with conn.begin():
                refreshed = await st._refresh_statistics(conn)
            assert {"conveyor_deliveries", "conveyor_tasks"} <= set(refreshed)
            assert {"conveyor_deliveries", "conveyor_tasks"} <= await _analysed(conn)
            async with conn.begin():
                assert await st._refresh_statistics(conn) == []
            await conn.close()


async def test_a_maintenance_pass_refreshes_statistics(pg_url: str) -> None:
    """maintain() leaves the busy tables analysed on a server whose autovacuum has
    not (failed before: no maintenance step gathered statistics)."""
    from tests._support import scratch_pg_database

    with scratch_pg_database("conveyor_stats") as url:
        async with conveyor.connect(url, listen=False) as st:
            await st.submit_many([{"name": "t", "queue": "q"} for _ in range(1000)])
        async with conveyor.connect(url, listen=False) as st:
            await st.maintain()
            conn = await _conn(st, write=False)
            assert {"conveyor_deliveries", "conveyor_tasks"} <= await _analysed(conn)
            await conn.close()
