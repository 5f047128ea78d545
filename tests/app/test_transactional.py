"""Transactional enqueue: ``submit(..., connection=conn)`` writes in the caller's own
SQLAlchemy transaction, on both backends: nothing is visible (or wakes anyone)
before the caller commits, nothing at all after a rollback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, String, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import conveyor
from _support import ADMIN_URL, idle_waits
from conveyor.store.base import TaskStore


def caller_url(store_url: str, *, sync: bool = False) -> str:
    """The application's own SQLAlchemy URL for the store's database."""
    parsed = make_url(store_url)
    if parsed.get_backend_name() == "sqlite":
        driver = "sqlite" if sync else "sqlite+aiosqlite"
    else:
        driver = "postgresql+psycopg"
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


@pytest.fixture
async def engine(store_url: str, store: TaskStore) -> AsyncIterator[AsyncEngine]:
    """The application's async engine on the store's (already migrated) database."""
    eng = create_async_engine(caller_url(store_url))
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
def sync_engine(store_url: str, sync_store: conveyor.SyncStore) -> Iterator[Engine]:
    eng = create_engine(caller_url(store_url, sync=True))
    try:
        yield eng
    finally:
        eng.dispose()


async def woken_within(store: TaskStore, queue: str, seconds: float) -> asyncio.Task[bool]:
    """A waiter that is already asleep on ``queue`` when this returns."""
    waiter = asyncio.create_task(store.wait_for_work([queue], seconds))
    await asyncio.sleep(0.05)
    return waiter


async def test_rollback_leaves_nothing_and_wakes_no_one(
    store: TaskStore, store_url: str, engine: AsyncEngine
) -> None:
    async with conveyor.connect(store_url) as other:
        here, there = await woken_within(store, "q", 1.5), await woken_within(other, "q", 1.5)
        async with engine.connect() as conn:
            task = await store.submit("t", {"n": 1}, queue="q", connection=conn)
            more = await store.submit_many(
                [{"name": "t", "queue": "q", "partition": "p"}], connection=conn
            )
            assert task.status is conveyor.Status.QUEUED and len(more) == 1
            await conn.rollback()
        assert await here is False and await there is False
        assert await store.get(task.id) is None
        assert (await store.list()).items == []
        assert await other.claim("q", worker_id="w") == []


async def test_commit_makes_tasks_claimable_and_wakes_an_idle_worker(
    store: TaskStore, store_url: str, engine: AsyncEngine
) -> None:
    app = conveyor.App(store_url)
    done = asyncio.Event()

    @app.task(name="welcome", queue="emails")
    async def welcome(ctx: Any, to: str) -> str:
        done.set()
        return to

    # On Postgres the worker runs on another store (its own LISTEN connection): only
    # the NOTIFY sent in the caller's transaction can wake it. On SQLite wake-ups
    # are in-process: the worker shares the producer's store.
    postgres = make_url(store_url).get_backend_name() == "postgresql"
    worker_store = conveyor.connect(store_url) if postgres else store
    # A wake-up missed would show as an idle wait that ran out its poll interval;
    # the timeouts below, longer than that, only guard against a hang.
    worker = app.worker("emails", store=worker_store, poll_interval=20, maintain_interval=None)
    with idle_waits(worker_store) as waits:
        runner = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(waits.idle.wait(), 30)  # found nothing, went to sleep
            async with engine.connect() as conn:
                with app.using(store):  # a task function submits in the caller's transaction too
                    task = await welcome.submit("a@b.c", connection=conn)
                await asyncio.sleep(0.5)
                assert not done.is_set()  # not visible before the commit
                assert await worker_store.get(task.id) is None
                await conn.commit()
            async with asyncio.timeout(60):
                await done.wait()
            finished = await store.wait(task.id, timeout=60)
            assert finished.status is conveyor.Status.SUCCEEDED and finished.result == "a@b.c"
        finally:
            worker.stop()
            await runner
            if worker_store is not store:
                await worker_store.close()
    assert waits and False not in waits, f"the worker polled: idle waits ended {waits}"


async def test_a_missing_parent_leaves_the_callers_transaction_usable(
    store: TaskStore, engine: AsyncEngine
) -> None:
    """Children of a parent that is not a task, in the caller's transaction: the
    error names it, nothing of the batch is written, and the caller's own work
    before and after it commits."""
    root = await store.submit("root", queue="q")
    async with engine.connect() as conn:
        await conn.execute(text("CREATE TABLE IF NOT EXISTS orders (n integer)"))
        await conn.execute(text("INSERT INTO orders (n) VALUES (1)"))
        with pytest.raises(conveyor.InvalidArgument) as bad:
            await store.submit_many(
                [
                    {"name": "c", "queue": "q", "parent": root.id},
                    {"name": "c", "queue": "q", "parent": "01ARZ3NDEKTSV4RRFFQ69G5FAZ"},
                ],
                connection=conn,
            )
        assert bad.value.field == "parent"
        child = await store.submit("c", queue="q", parent=root, connection=conn)
        await conn.execute(text("INSERT INTO orders (n) VALUES (2)"))
        await conn.commit()
        rows = (await conn.execute(text("SELECT n FROM orders ORDER BY n"))).all()
    assert [r[0] for r in rows] == [1, 2]
    assert [t.id for t in (await store.list(queue="q")).items] == [root.id, child.id]
    assert (await store.get(child.id)) == child and child.root_id == root.id


async def test_key_conflicts_inside_the_callers_transaction(
    store: TaskStore, engine: AsyncEngine
) -> None:
    existing = await store.submit("t", {"v": 0}, key="k")
    async with engine.connect() as conn:
        reused = await store.submit("t", {"v": 1}, key="k", connection=conn)
        assert reused == existing
        fresh = await store.submit("t", {"v": 2}, key="other", connection=conn)
        with pytest.raises(conveyor.AlreadyExists):
            await store.submit_many(
                [{"name": "t", "key": "third"}, {"name": "t", "key": "k", "conflict": "reject"}],
                connection=conn,
            )
        # The refused batch left nothing behind, and the transaction goes on.
        replacing = await store.submit("t", {"v": 3}, key="k", conflict="replace", connection=conn)
        assert replacing.id != existing.id
        # Not visible to the store before the commit: the old task still answers the key.
        assert (await store.get_by_key("k")) == existing
        await conn.commit()
    assert (await store.get_by_key("other")) == fresh
    assert await store.get_by_key("third") is None
    after = await store.get(existing.id)
    assert after is not None and after.status is conveyor.Status.CANCELLED
    assert (await store.get_by_key("k")) == replacing
    # A replace that is rolled back changes nothing.
    async with engine.connect() as conn:
        await store.submit("t", key="k", conflict="replace", connection=conn)
        await conn.rollback()
    assert (await store.get_by_key("k")) == replacing
    assert (await store.get(replacing.id)).status is conveyor.Status.QUEUED  # type: ignore[union-attr]


async def test_partitions_and_group_fan_out_as_in_a_normal_submit(
    store: TaskStore, engine: AsyncEngine
) -> None:
    await store.subscribe("orders", "audit", start="new")
    async with engine.connect() as conn:
        tasks = await store.submit_many(
            [{"name": "o", "queue": "orders", "partition": "c7", "payload": i} for i in range(3)],
            connection=conn,
        )
        await conn.commit()
    ids = [t.id for t in tasks]
    queue_mode = await store.claim("orders", worker_id="w", limit=10)
    assert [t.id for t in queue_mode] == ids  # one stream, in order
    group = await store.claim("orders", worker_id="w", limit=10, group="audit")
    assert [t.id for t in group] == ids and all(t.group == "audit" for t in group)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))


async def test_orm_session_commits_the_order_and_its_task_together(
    store: TaskStore, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    app = conveyor.App(store.url)

    @app.task(name="send_receipt")
    async def send_receipt(ctx: Any, order_id: int) -> None: ...

    with app.using(store):
        async with AsyncSession(engine) as session:
            session.add(Order(id=1, email="a@b.c"))
            await send_receipt.submit(1, connection=session)
            await session.rollback()
        async with AsyncSession(engine) as session:
            session.add(Order(id=2, email="x@y.z"))
            await session.flush()
            task = await send_receipt.submit(2, connection=session)
            await session.commit()
    async with AsyncSession(engine) as session:
        orders = (await session.execute(text("SELECT id FROM shop_orders"))).scalars().all()
    assert orders == [2]
    page = await store.list()
    assert [t.id for t in page.items] == [task.id] and task.payload == {"args": [2], "kwargs": {}}


async def test_with_options_binds_the_callers_session(
    store: TaskStore, engine: AsyncEngine
) -> None:
    """The typed path: ``with_options(connection=...)`` (a ``connection=`` keyword of
    ``submit`` is not among the handler's parameters a type checker knows)."""
    app = conveyor.App(store.url)

    @app.task(name="send_receipt", queue="receipts")
    async def send_receipt(ctx: Any, order_id: int) -> None: ...

    with app.using(store):
        async with AsyncSession(engine) as session:
            gone = await send_receipt.with_options(connection=session).submit(1)
            await session.rollback()
        async with AsyncSession(engine) as session:
            kept = await send_receipt.with_options(connection=session, key="o2").submit(2)
            await session.commit()
    assert await store.get(gone.id) is None
    found = await store.get(kept.id)
    assert found is not None and found.key == "o2" and found.queue == "receipts"


def test_the_sync_store_takes_a_connection_or_a_session(
    sync_store: conveyor.SyncStore, sync_engine: Engine
) -> None:
    with sync_engine.connect() as conn:
        gone = sync_store.submit("t", {"n": 1}, connection=conn)
        conn.rollback()
        kept = sync_store.submit_many([{"name": "t", "payload": 2}], connection=conn)[0]
        assert sync_store.get(kept.id) is None
        conn.commit()
    with Session(sync_engine) as session:
        also = sync_store.submit("t", {"n": 3}, key="s", connection=session)
        session.commit()
    assert sync_store.get(gone.id) is None
    assert sync_store.get(kept.id) == kept and sync_store.get_by_key("s") == also


async def test_refused_connections(
    store: TaskStore, store_url: str, engine: AsyncEngine, tmp_path: Path, pg_url: str
) -> None:
    sqlite = make_url(store_url).get_backend_name() == "sqlite"
    other_url = f"sqlite+aiosqlite:///{tmp_path / 'elsewhere.db'}" if sqlite else caller_url(pg_url)
    if not sqlite:
        # Another database on the same server: the one the test run administers from.
        other_url = caller_url(ADMIN_URL)
    wrong_dialect = caller_url(pg_url) if sqlite else f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    cases: list[tuple[str, str]] = [
        (other_url, "another database"),
        (wrong_dialect, "database but the store is on"),
    ]
    for url, message in cases:
        eng = create_async_engine(url)
        try:
            async with eng.connect() as conn:
                with pytest.raises(conveyor.ConfigurationError, match=message):
                    await store.submit("t", connection=conn)
        finally:
            await eng.dispose()
    async with engine.connect() as conn:
        auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(conveyor.ConfigurationError, match="autocommit"):
            await store.submit("t", connection=auto)
    if not sqlite:  # autocommit switched on in the driver, behind SQLAlchemy's back
        eng = create_async_engine(caller_url(store_url), connect_args={"autocommit": True})
        try:
            async with eng.connect() as conn:
                with pytest.raises(conveyor.ConfigurationError, match="autocommit"):
                    await store.submit("t", connection=conn)
        finally:
            await eng.dispose()
    with pytest.raises(conveyor.ConfigurationError, match="AsyncConnection or AsyncSession"):
        await store.submit("t", connection="not a connection")
    assert (await store.list()).items == []


def test_the_sync_store_refuses_async_connections(
    sync_store: conveyor.SyncStore, store_url: str
) -> None:
    async def attempt() -> None:
        engine = create_async_engine(caller_url(store_url))
        try:
            async with AsyncSession(engine) as session:
                with pytest.raises(conveyor.ConfigurationError, match="Connection or Session"):
                    sync_store.submit("t", connection=session)
        finally:
            await engine.dispose()

    asyncio.run(attempt())
    assert sync_store.list().items == []


@pytest.mark.parametrize("driver", ["postgresql+asyncpg", "postgresql+psycopg"])
async def test_a_partitioned_batch_in_a_transaction_of_either_postgres_driver(
    store: TaskStore, store_url: str, backend: str, driver: str
) -> None:
    """Keys, partitions and a group, submitted in a transaction on the caller's own
    driver: asyncpg takes the statements built with SQLAlchemy (the store's own texts
    are written in psycopg's parameter style); each stream is then claimed in order."""
    if backend != "postgres":
        pytest.skip("Postgres drivers")
    if driver.endswith("asyncpg"):
        pytest.importorskip("asyncpg")
    await store.subscribe("q", "g")
    eng = create_async_engine(make_url(store_url).set(drivername=driver))
    try:
        async with eng.connect() as conn:
            tasks = await store.submit_many(
                [
                    {"name": "t", "queue": "q", "partition": f"p{i % 3}", "payload": i}
                    for i in range(9)
                ]
                + [{"name": "t", "queue": "q", "key": "once", "payload": 9}],
                connection=conn,
            )
            await conn.commit()
    finally:
        await eng.dispose()
    assert [t.payload for t in tasks] == list(range(10))
    for group in (None, "g"):
        seen: list[int] = []
        while got := await store.claim("q", worker_id="w", group=group, limit=10, per_stream=1):
            seen += [t.payload for t in got]
            await store.ack_many([{"task_id": t.id, "worker_id": "w", "group": group} for t in got])
        for p in range(3):
            assert [n for n in seen if n != 9 and n % 3 == p] == [p, p + 3, p + 6]
        assert sorted(seen) == list(range(10))


async def test_every_kind_of_submit_runs_in_a_transaction_of_asyncpg(
    store: TaskStore, store_url: str, backend: str
) -> None:
    """The store's statements, rebuilt once in asyncpg's ``$n`` style, serve each
    kind of submit on the caller's asyncpg connection: plain, children, keys
    (reused, refused, replaced), partitions with parents; all committed by the
    caller at once."""
    if backend != "postgres":
        pytest.skip("Postgres drivers")
    pytest.importorskip("asyncpg")
    root = await store.submit("t", queue="q", key="held")
    eng = create_async_engine(make_url(store_url).set(drivername="postgresql+asyncpg"))
    try:
        async with eng.connect() as conn:
            one = await store.submit("t", queue="q", payload=1, connection=conn)
            many = await store.submit_many(
                [{"name": "t", "queue": "q", "payload": i} for i in range(3)], connection=conn
            )
            child = await store.submit("t", queue="q", parent=root.id, connection=conn)
            reused = await store.submit("t", queue="q", key="held", connection=conn)
            with pytest.raises(conveyor.AlreadyExists):
                await store.submit("t", queue="q", key="held", conflict="reject", connection=conn)
            swapped = await store.submit(
                "t", queue="q", key="held", conflict="replace", partition="p", connection=conn
            )
            kids = await store.submit_many(
                [{"name": "t", "queue": "q", "parent": root.id, "partition": "p"}] * 2,
                connection=conn,
            )
            assert await store.get(one.id) is None  # not committed yet
            await conn.commit()
    finally:
        await eng.dispose()
    assert reused.id == root.id and swapped.id != root.id
    assert child.root_id == root.id and [k.root_id for k in kids] == [root.id] * 2
    gone = await store.get(root.id)
    assert gone is not None and gone.status is conveyor.Status.CANCELLED
    for task in (one, *many, child, swapped, *kids):
        assert await store.get(task.id) == task
    got = await store.claim("q", worker_id="w", limit=10, per_stream=3)
    assert [t.id for t in got if t.partition == "p"] == [swapped.id, *(k.id for k in kids)]
