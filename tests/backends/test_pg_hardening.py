"""Postgres transaction hardening: timeouts, bounded retries, connection loss."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

import conveyor
from conveyor.errors import InvalidArgument, StoreUnavailable
from conveyor.store.base import TaskStore


@pytest.fixture
async def pg(pg_url: str) -> AsyncIterator[TaskStore]:
    async with conveyor.connect(pg_url, statement_timeout=0.5, lock_timeout=0.3) as st:
        yield st


async def test_every_transaction_carries_its_timeouts(pg: TaskStore) -> None:
    async def show(conn: AsyncConnection) -> tuple[str, str]:
        a = (await conn.execute(text("SHOW statement_timeout"))).scalar_one()
        b = (await conn.execute(text("SHOW lock_timeout"))).scalar_one()
        return a, b

    assert await pg._run(show) == ("500ms", "300ms")


async def test_statement_timeout_fires(pg: TaskStore) -> None:
    async def slow(conn: AsyncConnection) -> None:
        await conn.execute(text("SELECT pg_sleep(2)"))

    with pytest.raises(StoreUnavailable):
        await pg._run(slow)
    assert (await pg.submit("still-works")).name == "still-works"


async def test_serialization_failure_is_retried(pg: TaskStore) -> None:
    calls = 0

    async def flaky(conn: AsyncConnection) -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            await conn.execute(
                text("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")
            )
        return "done"

    assert await pg._run(flaky) == "done"
    assert calls == 3


async def test_persistent_serialization_failure_surfaces_as_conveyor_error(pg: TaskStore) -> None:
    async def always(conn: AsyncConnection) -> None:
        await conn.execute(
            text("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")
        )

    with pytest.raises(StoreUnavailable):
        await pg._run(always)


async def test_real_deadlock_is_retried(pg_url: str) -> None:
    async with conveyor.connect(pg_url, lock_timeout=5) as st:
        await st.configure_queue("a", lease=1)
        await st.configure_queue("b", lease=1)
        attempts = {"ab": 0, "ba": 0}
        both_hold = asyncio.Barrier(2)

        def worker(first: str, second: str) -> object:
            async def work(conn: AsyncConnection) -> None:
                attempts[first + second] += 1
                lock = "SELECT 1 FROM conveyor_queues WHERE queue = :q FOR UPDATE"
                await conn.execute(text(lock), {"q": first})
                if attempts[first + second] == 1:
                    await both_hold.wait()  # both hold their first row: a real cycle
                await conn.execute(text(lock), {"q": second})

            return work

        await asyncio.gather(st._run(worker("a", "b")), st._run(worker("b", "a")))  # type: ignore[arg-type]
        assert sum(attempts.values()) == 3  # one side was chosen as victim and retried


async def test_connection_loss_is_a_clear_error_and_the_pool_recovers(pg: TaskStore) -> None:
    await pg.submit("before")

    async def terminate_others(conn: AsyncConnection) -> None:
        await conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )

    async def killed_mid_call(conn: AsyncConnection) -> None:
        await conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))

    with pytest.raises(StoreUnavailable):
        await pg._run(killed_mid_call)
    async with conveyor.connect(pg.url) as other:
        await other._run(terminate_others)
    task = await pg.submit("after")  # pre-ping replaces the dead pooled connections
    assert (await pg.get(task.id)) is not None


def test_isolation_level_comes_from_a_whitelist(pg_url: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        conveyor.connect(pg_url, isolation_level="READ COMMITTED; DROP TABLE x")
    assert info.value.field == "isolation_level"
