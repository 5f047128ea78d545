"""Postgres connection set-up: timeouts set once per connection (or per transaction
for transaction-mode poolers), plain READ COMMITTED, a dead pooled connection
replaced without a pre-ping."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

import conveyor
from conveyor import InvalidArgument, Status
from conveyor.store.postgres import PostgresStore
from conveyor.store.postgres import direct as pg_direct
from conveyor.store.protocol import texts
from conveyor.store.protocol.queries import QUEUE_MODE


async def _show(conn: AsyncConnection) -> tuple[str, str, str]:
    out = []
    for name in ("statement_timeout", "lock_timeout", "transaction_isolation"):
        out.append((await conn.execute(text(f"SHOW {name}"))).scalar_one())
    return out[0], out[1], out[2]


@pytest.mark.parametrize("mode", ["connection", "transaction"])
async def test_timeouts_hold_in_both_modes(pg_url: str, mode: str) -> None:
    async with conveyor.connect(
        pg_url, statement_timeout=0.5, lock_timeout=0.3, timeouts=mode
    ) as st:
        assert await st._run(_show) == ("500ms", "300ms", "read committed")
        # and the one-statement paths work either way (a queue of its own: this
        # database is shared with the other tests of this module, which leave
        # tasks queued in theirs)
        queue = f"timeouts-{mode}"
        task = await st.submit("t", queue=queue)
        [got] = await st.claim(queue, worker_id="w")
        assert got.id == task.id
        assert await st.ack_many([{"task_id": got.id, "worker_id": "w"}]) == [None]


def test_timeouts_mode_is_checked(pg_url: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        conveyor.connect(pg_url, timeouts="statement")
    assert info.value.field == "timeouts"


async def test_dead_pooled_connections_are_replaced(pg_url: str) -> None:
    async with conveyor.connect(pg_url) as st:
        await st.submit("before", queue="q")

        async def terminate_others(conn: AsyncConnection) -> None:
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )

        async with conveyor.connect(pg_url, listen=False) as other:
            await other._run(terminate_others)
        # a transaction on a dead connection is retried once on a new one
        task = await st.submit("after", queue="q")
        assert (await st.get(task.id)) is not None


@pytest.mark.parametrize("durable", [False, True])
async def test_a_claim_commits_without_waiting_for_the_flush_unless_durable(
    pg_url: str, durable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's transaction turns ``synchronous_commit`` off for itself alone
    (a lease lost with a server crash only means the task runs again); with
    ``durable_claims=True`` the claim hook runs the statement that keeps the
    server's setting. Either way it leases."""
    async with conveyor.connect(pg_url, durable_claims=durable) as st:
        first = await st.submit("t", queue="quick")
        task = await st.submit("t", queue="quick")
        ran: list[str] = []
        alone = texts.alone

        async def spy(store: Any, statement: texts.Text, *args: Any, **kwargs: Any) -> Any:
            ran.append(statement.name)
            return await alone(store, statement, *args, **kwargs)

        monkeypatch.setattr(texts, "alone", spy)
        assert [t.id for t in await st.claim("quick", worker_id="w")] == [first.id]
        assert ran == ["claim.one_durable" if durable else "claim.one"]
        claim = st._texts.get(ran[0]) if st._texts is not None else None
        assert claim is not None
        params = {
            "grp": QUEUE_MODE, "queue": "quick", "partition": None, "limit": 1,
            "per_stream": 1, "streams": 1, "mix": False, "worker_id": "w", "lease": None,
            "keyless": True, "flow": False,
        }  # fmt: skip

        async def look(conn: AsyncConnection) -> tuple[list[str], str]:
            rows = list(await texts.execute(conn, st, claim, params))
            ids = [row.id for row in rows]
            return ids, (await conn.execute(text("SHOW synchronous_commit"))).scalar_one()

        ids, setting = await st._run(look)
        assert ids == [task.id]
        assert setting == ("on" if durable else "off")
        # and the rest of the store's writes keep the server's setting
        assert (await st._run(_sync_commit)) == "on"
        assert (await st.get(task.id)).status is Status.RUNNING  # type: ignore[union-attr]


async def _sync_commit(conn: AsyncConnection) -> str:
    return str((await conn.execute(text("SHOW synchronous_commit"))).scalar_one())


def test_durable_claims_is_checked(pg_url: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        conveyor.connect(pg_url, durable_claims="yes")
    assert info.value.field == "durable_claims"


async def test_single_statements_run_on_kept_autocommit_connections(pg_url: str) -> None:
    """A statement run by itself takes one of at most ``direct_connections``
    connections the store keeps in autocommit (with the store's timeouts), and gives
    it back; more at once take pooled ones; one that died is replaced; close()
    closes them."""
    async with conveyor.connect(
        pg_url, statement_timeout=0.7, listen=False, direct_connections=pg_direct.KEEP
    ) as st:
        assert isinstance(st, PostgresStore)
        for _ in range(3):
            await st.submit("t", queue="kept")
        direct = st._direct
        assert direct is not None and direct._made == 1 and len(direct._idle) == 1
        first = direct._idle[0]
        assert first.driver.autocommit
        [row] = await st._run_direct("SELECT current_setting('statement_timeout') AS s", {})
        assert row.s == "700ms" and direct._idle == [first]
        await asyncio.gather(*(st.submit("t", queue="kept") for _ in range(12)))
        assert direct._made == len(direct._idle) == pg_direct.KEEP
        # A kept connection the server ended is dropped; the retry takes another.
        pids = [kept.driver.info.backend_pid for kept in direct._idle]
        async with conveyor.connect(pg_url, listen=False) as other:
            await other._run_direct("SELECT pg_terminate_backend(%(pid)s)", {"pid": pids[-1]})
        task = await st.submit("t", queue="kept")
        assert (await st.get(task.id)) is not None
        assert direct._made == len(direct._idle) <= pg_direct.KEEP
        assert pids[-1] not in [kept.driver.info.backend_pid for kept in direct._idle]
        kept = [k.driver for k in direct._idle]
    assert st._direct is None and direct._made == 0 and all(conn.closed for conn in kept)


async def test_kept_connections_grow_with_concurrency_and_shrink_when_idle(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent single statements keep up to ``direct_connections`` connections,
    never more; once idle for ``IDLE_CLOSE`` those beyond ``KEEP`` are closed (on
    the server too), and the store goes on working on the rest."""
    monkeypatch.setattr(pg_direct, "IDLE_CLOSE", 0.3)
    async with conveyor.connect(pg_url, listen=False, direct_connections=5) as st:
        assert isinstance(st, PostgresStore)
        await asyncio.gather(*(st.submit("t", queue="grow") for _ in range(20)))
        direct = st._direct
        assert direct is not None
        assert pg_direct.KEEP < direct._made <= 5 and len(direct._idle) == direct._made
        pids = {kept.driver.info.backend_pid for kept in direct._idle}
        await asyncio.sleep(0.8)
        assert direct._made == len(direct._idle) == pg_direct.KEEP
        left = {kept.driver.info.backend_pid for kept in direct._idle}
        [row] = await st._run_direct(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = ANY(%(pids)s)",
            {"pids": sorted(pids - left)},
        )
        assert row.n == 0  # the closed ones are gone from the server
        assert len((await st.list(queue="grow", limit=100)).items) == 20
        task = await st.submit("t", queue="grow")
        assert (await st.get(task.id)) is not None


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True, None])
def test_direct_connections_is_checked(pg_url: str, bad: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        conveyor.connect(pg_url, direct_connections=bad)
    assert info.value.field == "direct_connections"
    assert "1 or more" in str(info.value)
