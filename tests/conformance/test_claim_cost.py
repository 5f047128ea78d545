"""Claim cost does not grow with history: the claim statements read only partial indexes.

A claim in a group must not read the tasks that group (or queue mode) already
finished, nor another group's rows. Instead of timing, the planner is asked: after
loading a finished history (and a lagging second group with all of it still
queued) and running ANALYZE, each statement a claim runs must be planned on the
partial index that holds only the live rows, with the group in its index
condition. Nothing is forced: no ``enable_seqscan = off``; the plan is the one the
database would really choose for the bound parameters (Postgres after ANALYZE, as
autovacuum would; SQLite without statistics, as nothing runs ANALYZE for it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection
from tests._support import plan

from conveyor.schema import deliveries as d
from conveyor.schema import streams as s
from conveyor.store.base import TaskStore
from conveyor.store.protocol import queries as q
from conveyor.store.sqlite.connection import register_functions

Q = "history"
HISTORY = 10_000  # x 2 views finished = 20k finished delivery rows
CHUNK = 5_000
API_PARTITIONS = 50  # partitioned history submitted through the API
OLD_STREAMS = 3_000  # finished streams of earlier partitions (stream rows only)

READY = "ix_conveyor_deliveries_ready"
STREAM = "ix_conveyor_deliveries_stream"
LEASED = "ix_conveyor_deliveries_leased"
AVAILABLE = "ix_conveyor_streams_available"


async def statement_plan(
    store: TaskStore, store_url: str, backend: str, name: str, params: dict[str, Any]
) -> str:
    """The plan the database chooses for the built statement ``name`` with
    ``params`` (SQLite's ``EXPLAIN QUERY PLAN`` details, Postgres's ``EXPLAIN``
    lines), planned on a connection of the test's own: the statements a claim
    runs as the dialect's claim hook sends them."""
    assert store._texts is not None
    sql = store._texts[name].sql
    if backend == "sqlite":
        with closing(sqlite3.connect(make_url(store_url).database or "")) as db:
            register_functions(db)
            return "\n".join(
                str(row[-1]) for row in db.execute("EXPLAIN QUERY PLAN " + sql, params)
            )
    import psycopg

    dsn = make_url(store_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("EXPLAIN " + sql, params).fetchall()  # type: ignore[arg-type]
    return "\n".join(str(row[0]) for row in rows)


def claim_params(backend: str, grp: str, limit: int, per_stream: int) -> dict[str, Any]:
    """The parameters of the claim hook's statement for one queue (Postgres's
    ``claim.one``, SQLite's ``claim.candidates``)."""
    common: dict[str, Any] = {
        "grp": grp,
        "queue": Q,
        "partition": None,
        "limit": limit,
        "per_stream": per_stream,
        "streams": limit,
        "flow": False,
    }
    if backend == "sqlite":
        return {**common, "now_us": 2**62}
    return {
        **common,
        "mix": True,
        "worker_id": "w",
        "lease": None,
        "keyless": False,
        "offset_us": 0,
    }


async def load(store: TaskStore, backend: str) -> None:
    """10k tasks finished for queue mode and group ``g``; group ``other`` lags behind
    with all of them still queued; a little live work on top."""
    await store.subscribe(Q, "g")
    await store.subscribe(Q, "other")
    for start in range(0, HISTORY, CHUNK):
        await store.submit_many(
            [
                {
                    "name": "old",
                    "queue": Q,
                    "partition": f"old-{n % API_PARTITIONS}" if n < 2 * API_PARTITIONS else None,
                }
                for n in range(start, start + CHUNK)
            ]
        )

    async def finish_history(conn: AsyncConnection) -> None:
        # The state the store leaves after claim + succeed, written in bulk to save time.
        await conn.execute(
            update(d)
            .where(d.c.grp.in_([q.QUEUE_MODE, "g"]))
            .values(status="succeeded", attempt=1, started_at=d.c.run_at, finished_at=d.c.run_at)
        )
        await conn.execute(
            update(s)
            .where(s.c.grp.in_([q.QUEUE_MODE, "g"]))
            .values(head_seq=None, priority=None, available_at=None)
        )
        await conn.execute(
            s.insert(),
            [
                {"queue": Q, "grp": grp, "partition": f"gone-{n}"}
                for grp in (q.QUEUE_MODE, "g", "other")
                for n in range(OLD_STREAMS)
            ],
        )

    await store._run(finish_history)

    # Live work: plain and partitioned, some of it leased, in queue mode and in g.
    await store.submit_many([{"name": "new", "queue": Q} for _ in range(30)])
    await store.submit_many(
        [{"name": "new", "queue": Q, "partition": f"live-{n % 5}"} for n in range(10)]
    )
    for group in (None, "g"):
        for _ in range(3):
            assert await store.claim(Q, worker_id="w", group=group, limit=2)

    # Postgres: autovacuum keeps statistics, so plan with them. SQLite: nothing runs
    # ANALYZE for the store, so its planner must get it right without statistics.
    if backend == "postgres":

        async def analyze(conn: AsyncConnection) -> None:
            await conn.execute(text("ANALYZE"))

        await store._run(analyze)


def assert_uses(backend: str, text_plan: str, index: str | tuple[str, ...], table: str) -> None:
    wanted = (index,) if isinstance(index, str) else index
    assert any(i in text_plan for i in wanted), f"{' or '.join(wanted)} not used:\n{text_plan}"
    if backend == "sqlite":
        # "SCAN t" without an index reads the whole table.
        for line in text_plan.splitlines():
            assert not (line.startswith(f"SCAN {table}") and "INDEX" not in line), text_plan
        assert "grp=?" in text_plan, text_plan
    else:
        assert f"Seq Scan on {table}" not in text_plan, text_plan
        assert "grp)::text =" in text_plan, text_plan


def assert_keyed_update(backend: str, text_plan: str, what: str) -> None:
    """Every access to the deliveries table is a lookup by the full key of an index."""
    lines = [line for line in text_plan.splitlines() if "conveyor_deliveries" in line]
    assert lines, f"{what}: no access to the deliveries table?\n{text_plan}"
    if backend == "sqlite":
        for line in lines:
            assert line.startswith("SEARCH"), f"{what}:\n{text_plan}"
            # The pick itself reads the ready index; everything else is keyed by task_seq.
            assert READY in line or "task_seq=?" in line, f"{what}:\n{text_plan}"
    else:
        plan_lines = text_plan.splitlines()
        scans = [
            n
            for n, line in enumerate(plan_lines)
            if "Scan" in line and " on conveyor_deliveries" in line
        ]
        assert scans, f"{what}: no scan of the deliveries table?\n{text_plan}"
        for n in scans:
            line = plan_lines[n]
            assert "Seq Scan" not in line, f"{what}:\n{text_plan}"
            if READY in line:
                continue  # the pick reads the ready index
            cond = next((x for x in plan_lines[n + 1 :] if "Index Cond" in x), "")
            assert "task_seq" in cond, f"{what}: not keyed by task_seq:\n{text_plan}"


async def test_claim_statements_use_the_partial_indexes(
    store: TaskStore, store_url: str, backend: str
) -> None:
    await load(store, backend)
    now = store._now()
    lock: Callable[[Any], Any] = store._lock_candidates
    for grp in (q.QUEUE_MODE, "g"):
        plans = {
            "ready_plain": (
                lock(q.ready_plain(grp, [Q], now).limit(10)),
                READY,
                "conveyor_deliveries",
            ),
            "ready_streams": (
                lock(q.ready_streams(grp, [Q], now, None)),
                AVAILABLE,
                "conveyor_streams",
            ),
            "recover_expired": (
                q.recover_expired(now, grp, [Q], "{}"),
                LEASED,
                "conveyor_deliveries",
            ),
            "expired probe": (
                select(d.c.task_seq).where(*q.expired(now, grp, [Q])).limit(1),
                LEASED,
                "conveyor_deliveries",
            ),
        }
        for name, (stmt, index, table) in plans.items():
            text_plan = await plan(store, stmt)
            try:
                assert_uses(backend, text_plan, index, table)
            except AssertionError as exc:
                raise AssertionError(f"{name} for group {grp!r}: {exc}") from None

        # The claim hook's own statement: every index it reads is a partial one
        # holding live rows, with the group in its condition; nothing reads a
        # table whole.
        claim = "claim.candidates" if backend == "sqlite" else "claim.one"
        text_plan = await statement_plan(
            store, store_url, backend, claim, claim_params(backend, grp, 10, 5)
        )
        for index in (READY, STREAM, AVAILABLE, LEASED):
            assert index in text_plan, f"{claim} for group {grp!r}: {index} not used:\n{text_plan}"
        for table in ("conveyor_deliveries", "conveyor_streams"):
            assert f"Seq Scan on {table}" not in text_plan, text_plan
        assert ("grp=?" if backend == "sqlite" else "grp)::text =") in text_plan, text_plan
        for line in text_plan.splitlines():
            # SQLite: "SCAN <alias>" without an index reads a whole table; only the
            # statement's own CTEs (f, p, e) may be scanned so.
            if line.startswith("SCAN ") and "INDEX" not in line:
                assert line.split()[1] in ("f", "p", "e"), text_plan
        if backend == "sqlite":
            # The lease: row by row through the primary key.
            lease = {"grp": grp, "queue": Q, "seqs": "[1, 2, 3]", "w_id": "w", "lease": None}
            text_plan = await statement_plan(
                store, store_url, backend, "claim.lease", {**lease, "now_us": 0}
            )
            assert_keyed_update(backend, text_plan, f"claim.lease for group {grp!r}")

    # And the claims themselves still do the right thing on top of the history.
    async def count(conn: AsyncConnection) -> int:
        return int((await conn.execute(select(func.count()).select_from(d))).scalar_one())

    assert await store._run(count) > 3 * HISTORY
    for group in (None, "g"):
        got = []
        while batch := await store.claim(Q, worker_id="x", group=group, limit=100):
            got += batch
        # 30 plain + 10 partitioned, minus the 6 claimed in load() (streams: one
        # batch per stream at a time, so claims stop when every stream is held).
        assert all(t.name == "new" for t in got)
        assert 0 < len(got) <= 34
    stats = {st.queue: st for st in await store.stats(Q)}
    assert stats[Q].groups["other"].lag == HISTORY + 40
    assert stats[Q].counts["succeeded"] == HISTORY
