"""A server that turns read-only under a running store (as a primary does when a
failover demotes it): its refusals (SQLSTATE 25006, "cannot execute ... in a
read-only transaction") are retried on new connections, a call that outlasts
them fails as StoreUnavailable saying why (never as a bug report), nothing is
written meanwhile, and the store goes on once the server takes writes again."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
from _pgcluster import Cluster

import conveyor

pytestmark = pytest.mark.xdist_group("pg_cluster")


def _read_only(cluster: Cluster, on: bool) -> None:
    # Every session of the server, those already open included, after the reload.
    with psycopg.connect(cluster.admin_dsn, autocommit=True) as conn:
        if on:
            conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        else:
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
        conn.execute("SELECT pg_reload_conf()")


async def _count(store: conveyor.TaskStore, queue: str) -> int:
    stats = await store.stats(queue)
    return sum(stats[0].counts.values()) if stats else 0


@pytest.mark.timeout(120)
async def test_a_server_turned_read_only_is_waited_out(pg_cluster: Cluster) -> None:
    url = pg_cluster.create_database(f"read_only_{uuid.uuid4().hex[:6]}")
    queue = "ro"
    async with conveyor.connect(url) as store:
        # warm: kept connections, the pool and the listener all open on the server
        await store.submit("before", queue=queue)
        await store.submit_many([{"name": "before", "queue": queue}] * 3)
        try:
            _read_only(pg_cluster, True)
            await asyncio.sleep(0.5)
            for write in (
                lambda: store.submit("refused", queue=queue),
                lambda: store.submit_many([{"name": "refused", "queue": queue}] * 3),
                lambda: store.claim(queue, worker_id="w"),
            ):
                with pytest.raises(conveyor.StoreUnavailable, match="read-only"):
                    await write()
            assert await _count(store, queue) == 4, "nothing written while read-only"

            # A write that starts while the server is read-only and outlives it.
            pending = asyncio.ensure_future(store.submit("through", queue=queue))
            await asyncio.sleep(0.3)
            assert not pending.done()
        finally:
            _read_only(pg_cluster, False)
        task = await pending
        assert task.name == "through"
        claimed = await store.claim(queue, worker_id="w", limit=10)
        assert len(claimed) == 5
        for one in claimed:
            await store.succeed(one.id, worker_id="w", attempt=one.attempt)
        stats = await store.stats(queue)
        assert stats[0].counts.get("succeeded") == 5
