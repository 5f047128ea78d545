"""Postgres: a large plain batch goes in runs of ``submit_runs.RUN`` tasks, pipelined on a
kept connection in one transaction, each run sent as its requests are validated
(conveyor.store.protocol.submit_runs); without a kept connection free, the same runs go in an
ordinary transaction; a refused request leaves no transaction open."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import conveyor
from conveyor import InvalidArgument
from conveyor.store.postgres import PostgresStore
from conveyor.store.protocol import submit_runs

N = 4 * submit_runs.RUN + 111


def _expected_runs(n: int) -> list[int]:
    """A batch's runs: a short first one (the server starts sooner), then full ones."""
    out = [submit_runs.FIRST]
    while sum(out) < n:
        out.append(min(submit_runs.RUN, n - sum(out)))
    return out


RUNS = _expected_runs(N)


def _requests(queue: str) -> list[dict[str, Any]]:
    return [{"name": "t", "payload": {"i": i}, "queue": queue} for i in range(N)]


def _runs(tasks: list[conveyor.Task]) -> list[int]:
    """The length of each stretch of tasks sharing a created_at: each run is a
    statement of its own, and a statement reads its clock once."""
    lengths: list[int] = []
    last = None
    for task in tasks:
        if task.created_at != last:
            lengths.append(0)
            last = task.created_at
        lengths[-1] += 1
    return lengths


async def test_a_large_batch_goes_in_runs_on_a_kept_connection(pg_url: str) -> None:
    async with conveyor.connect(pg_url, listen=False, direct_connections=1) as st:
        assert isinstance(st, PostgresStore)
        tasks = await st.submit_many(_requests("bulk-kept"))
        assert _runs(tasks) == RUNS
        assert [t.payload["i"] for t in tasks] == list(range(N))
        direct = st._direct
        assert direct is not None and direct._made == 1 and len(direct._idle) == 1
        # An iterable of unknown length is read whole before the transaction (no
        # caller code runs inside it): the same runs.
        idle_while_read: list[int] = []

        def requests() -> Iterator[dict[str, Any]]:
            for request in _requests("bulk-kept"):
                idle_while_read.append(len(direct._idle))  # the one kept connection
                yield request

        tasks = await st.submit_many(requests())
        assert _runs(tasks) == RUNS
        assert idle_while_read == [1] * N  # never taken for the transaction meanwhile
        # A batch of at most one run is one statement, as before.
        small = await st.submit_many(_requests("bulk-kept")[: submit_runs.RUN])
        assert _runs(small) == [submit_runs.RUN]
        page = await st.list(queue="bulk-kept", limit=3 * N)
        assert len(page.items) == 2 * N + submit_runs.RUN


async def test_without_a_kept_connection_free_the_runs_go_in_a_transaction(
    pg_url: str,
) -> None:
    async with conveyor.connect(pg_url, listen=False, direct_connections=1) as st:
        assert isinstance(st, PostgresStore)
        await st.submit("t", queue="bulk-busy")  # the one kept connection is made
        direct = st._kept()
        held = await direct._take("", {})  # and held, as by a statement running
        assert held is not None
        try:
            tasks = await st.submit_many(_requests("bulk-busy"))
        finally:
            await direct._put_back(held, False)
        assert _runs(tasks) == RUNS
        assert [t.payload["i"] for t in tasks] == list(range(N))
        for task in (tasks[0], tasks[submit_runs.RUN], tasks[-1]):
            assert await st.get(task.id) == task


async def test_a_refused_request_leaves_no_transaction_open(pg_url: str) -> None:
    async with conveyor.connect(pg_url, listen=False, direct_connections=1) as st:
        assert isinstance(st, PostgresStore)
        requests = _requests("bulk-refused")
        requests[3 * submit_runs.RUN + 5] = {"name": "t", "queue": "bulk-refused", "delay": -1}
        with pytest.raises(InvalidArgument) as info:
            await st.submit_many(requests)
        assert info.value.field == "delay"
        assert (await st.list(queue="bulk-refused")).items == []
        # Three runs had been sent: their transaction was rolled back with the
        # connection, which the server has let go of.
        for _ in range(100):
            [row] = await st._run_direct(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = "
                "current_database() AND state LIKE 'idle in transaction%%'",
                {},
            )
            if row.n == 0:
                break
            await asyncio.sleep(0.05)
        assert row.n == 0
        tasks = await st.submit_many(_requests("bulk-refused"))
        assert len(tasks) == N
