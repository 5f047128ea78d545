"""The hot statements' plans on Postgres read only the rows they change, with or
without table statistics.

A store's tables are often young: autovacuum has not analysed them yet (or is
off). Without statistics the planner guesses that any equality on an indexed
column finds about one row, so a lease or acknowledgement written with constant
conditions on the delivery row (``grp``, ``status``) could be planned through
the status index or the partial index of leased rows, walking every queued or
leased row of the queue for each claim or batch: O(queue) work per call. These
tests run the built-once texts under ``EXPLAIN ANALYZE`` on a fresh database
with thousands of queued and leased rows and count the delivery rows each plan's
UPDATE reads.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from tests._support import pg_texts, scratch_pg_database

import conveyor
from conveyor.store.postgres import direct as pg_direct
from conveyor.store.postgres import store as postgres

QUEUED = 4000
LEASED = 1000


@pytest.fixture
def young_db(pg_url: str) -> Iterator[str]:
    """A new database, migrated, never analysed (``pg_url`` only makes sure a
    server answers)."""
    with scratch_pg_database("conveyor_plans") as url:
        yield url


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


async def _fill(url: str) -> list[conveyor.Task]:
    async with conveyor.connect(url, listen=False) as st:
        for start in range(0, QUEUED + LEASED, 1000):
            batch = range(start, start + 1000)
            await st.submit_many([{"name": "t", "queue": "q", "payload": {"i": i}} for i in batch])
        leased: list[conveyor.Task] = []
        while len(leased) < LEASED:
            leased += await st.claim("q", worker_id="w", limit=100)
        return leased


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``plan`` and every node under it."""
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _delivery_rows_read(plan: dict[str, Any]) -> int:
    """Rows the UPDATE nodes' scans of conveyor_deliveries produced or filtered out,
    or the index and table pages they touched, whichever is more (an index walked
    on a condition beyond a missing column reads many pages for few rows)."""
    total = 0
    pages = 0

    def walk(node: dict[str, Any], in_update: bool) -> None:
        nonlocal total, pages
        updating = in_update or (
            node.get("Node Type") == "ModifyTable"
            and node.get("Relation Name") == "conveyor_deliveries"
        )
        if (
            updating
            and node.get("Relation Name") == "conveyor_deliveries"
            and "Scan" in node["Node Type"]
        ):
            loops = node.get("Actual Loops", 1)
            total += (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops
            total += node.get("Rows Removed by Index Recheck", 0)
            pages += node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        for child in node.get("Plans", []):
            walk(child, updating)

    walk(plan["Plan"], False)
    # About three pages per row found (index root, leaf, heap) is a lookup.
    return max(total, pages // 3)


def _explain(
    url: str, name: str, params: dict[str, Any], setup: str | None = None
) -> dict[str, Any]:
    sql, names = pg_direct.native(pg_texts()[name])
    with psycopg.connect(_dsn(url)) as conn:
        if setup is not None:
            conn.execute(setup)
        # Rolled back: the statement's changes are measured, not kept.
        cur = psycopg.RawCursor(conn)
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, [params[n] for n in names])
        row = cur.fetchone()
        conn.rollback()
    assert row is not None
    plan: dict[str, Any] = row[0][0]
    return plan


def _no_statistics(url: str) -> None:
    with psycopg.connect(_dsn(url)) as conn:
        [(analysed,)] = conn.execute(
            "SELECT count(*) FROM pg_stats WHERE tablename = 'conveyor_deliveries'"
        ).fetchall()
    assert analysed == 0, "the test needs a table without statistics"


def _claim_params(worker: str) -> dict[str, Any]:
    return {
        "grp": "",
        "partition": None,
        "limit": 1,
        "per_stream": 1,
        "streams": 1,
        "mix": False,
        "worker_id": worker,
        "lease": None,
        "keyless": True,
        "queue": "q",
        "offset_us": 0,
        "flow": False,
    }


async def test_a_claim_leases_through_the_primary_key(young_db: str) -> None:
    """claim(1) with 4,000 queued and 1,000 leased rows: the lease UPDATE reads a
    handful of delivery rows, not the group's queued rows (before: ~4,000, through
    the status index)."""
    await _fill(young_db)
    _no_statistics(young_db)
    plan = _explain(young_db, "claim.one", _claim_params("w2"))
    assert _delivery_rows_read(plan) <= 10


async def test_a_batch_acknowledgement_finds_its_rows_by_primary_key(young_db: str) -> None:
    """ack_many of 100 leased tasks with 1,000 leased: the UPDATE reads about the 100
    rows it finishes (before: every leased row joined to every item, ~100,000)."""
    leased = await _fill(young_db)
    _no_statistics(young_db)
    items = json.dumps([[t.id, "w", "", t.attempt, "null"] for t in leased[:100]])
    plan = _explain(young_db, "ack_plain", {"items": items, "offset_us": 0})
    read = _delivery_rows_read(plan)
    assert read <= 300, read


@pytest.mark.parametrize("fenced_out", [0, 1])
async def test_a_batch_whose_items_all_finish_compares_none_of_them_again(
    young_db: str, fenced_out: int
) -> None:
    """ack_many of 100 tasks: which items failed their fence is looked for only
    when fewer rows finished than there are items. Before, every item was compared
    with every finished row (a nested-loop anti-join, 4,950 comparisons here), in
    every batch. With an item of another worker in the batch, it is still found."""
    leased = await _fill(young_db)
    _no_statistics(young_db)
    entries = [[t.id, "w", "", t.attempt, "null"] for t in leased[:100]]
    if fenced_out:
        entries[41][1] = "someone-else"
    params = {"items": json.dumps(entries), "offset_us": 0}
    plan = _explain(young_db, "ack_plain", params)
    sql, names = pg_direct.native(pg_texts()["ack_plain"])
    with psycopg.connect(_dsn(young_db)) as conn:
        cur = psycopg.RawCursor(conn)
        cur.execute(sql, [params[n] for n in names])
        lost = [idx for (idx,) in cur.fetchall() if idx is not None]
        conn.rollback()
    compared = sum(node.get("Rows Removed by Join Filter", 0) for node in _nodes(plan["Plan"]))
    if fenced_out:
        assert lost == [42]  # 1-based
    else:
        assert lost == []
        assert compared == 0, compared


async def test_without_free_streams_a_claim_takes_plain_rows_without_ordering_units(
    young_db: str,
) -> None:
    """claim(10) of a queue with no partitioned work: the plain rows are taken in
    their index order, and the units that rank streams against plain rows are never
    read (before: every claim sorted and numbered its rows twice through them)."""
    await _fill(young_db)
    plan = _explain(young_db, "claim.one", {**_claim_params("w3"), "limit": 10})
    scans = [n for n in _nodes(plan["Plan"]) if n.get("CTE Name") in ("chosen", "ordered")]
    assert scans and all(n["Actual Loops"] == 0 for n in scans), scans
    assert plan["Plan"]["Actual Rows"] == 10


async def test_a_claim_of_one_queue_reads_its_configured_lease_once(young_db: str) -> None:
    """claim(10) of a queue with a configured lease: the queue's row is read once
    per claim, not once per task leased, and every task gets that lease."""
    await _fill(young_db)
    async with conveyor.connect(young_db, listen=False) as st:
        await st.configure_queue("q", lease=42.0)
    plan = _explain(young_db, "claim.one", {**_claim_params("w4"), "limit": 10})
    probes = [n for n in _nodes(plan["Plan"]) if n.get("Relation Name") == "conveyor_queues"]
    assert [n["Actual Loops"] for n in probes] == [1]
    async with conveyor.connect(young_db, listen=False) as st:
        tasks = await st.claim("q", worker_id="w5", limit=10)
    assert len(tasks) == 10 and {t.lease for t in tasks} == {42.0}


def _rows_read(plan: dict[str, Any], relation: str) -> int:
    """Rows every scan of ``relation`` in the plan produced or filtered out."""
    return sum(
        (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0))
        * node.get("Actual Loops", 1)
        for node in _nodes(plan["Plan"])
        if node.get("Relation Name") == relation and "Scan" in node["Node Type"]
    )


async def test_a_small_acknowledgement_looks_its_tasks_up_by_id(young_db: str) -> None:
    """ack_many of 10 (a worker's usual batch) with 5,000 tasks and no statistics:
    each item's task row is found by its id (before: every task row was read into
    a hash join, ~1 ms per batch at this size)."""
    leased = await _fill(young_db)
    _no_statistics(young_db)
    items = json.dumps([[t.id, "w", "", t.attempt, "null"] for t in leased[:10]])
    plan = _explain(young_db, "ack_plain", {"items": items, "offset_us": 0})
    assert _rows_read(plan, "conveyor_tasks") <= 10


async def test_with_statistics_a_small_acknowledgement_reads_only_its_rows(
    young_db: str,
) -> None:
    """Once the tables are analysed (autovacuum, or a maintenance pass where it is
    off), a batch of 10 reads its 10 task rows and its 10 delivery rows (before:
    all 5,000 task rows, ~1 ms per batch)."""
    leased = await _fill(young_db)
    with psycopg.connect(_dsn(young_db), autocommit=True) as conn:
        conn.execute("ANALYZE")
    items = json.dumps([[t.id, "w", "", t.attempt, "null"] for t in leased[:10]])
    plan = _explain(young_db, "ack_plain", {"items": items, "offset_us": 0})
    assert _rows_read(plan, "conveyor_tasks") <= 10
    assert _delivery_rows_read(plan) <= 30


async def test_the_prepared_acknowledgement_keeps_its_generic_plan(young_db: str) -> None:
    """A prepared statement is planned once (its generic plan) when that plan costs
    no more than the ones made for each call. The acknowledgement's estimate of
    its item count once differed between the two (a custom plan folded the
    array's length into a constant), and the server re-planned it on every call
    (~0.3 ms each): 25 % fewer claim + ack per second on an analysed store."""
    leased = await _fill(young_db)
    sql, names = pg_direct.native(pg_texts()["ack_plain"])
    with psycopg.connect(_dsn(young_db), autocommit=True) as conn:
        conn.execute("ANALYZE")
        conn.execute("PREPARE ack AS " + sql)
        for task in leased[:12]:
            items = json.dumps([[task.id, "w", "", task.attempt, "null"]])
            params = {"items": items, "offset_us": 0}
            psycopg.ClientCursor(conn).execute(
                "EXECUTE ack(" + ", ".join(["%s"] * len(names)) + ")",
                [params[n] for n in names],
            ).fetchall()
        [(generic, custom)] = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'ack'"
        ).fetchall()
    assert generic >= 6 and custom <= 6, (generic, custom)


async def test_locking_the_streams_of_an_acknowledgement_looks_its_tasks_up_by_id(
    young_db: str,
) -> None:
    """The first statement of a partitioned acknowledgement (locking the batch's
    streams) finds each item's task by its id: 10 items with 5,000 partitioned
    tasks read 10 task rows (before: all 5,000, 0.8 ms per batch)."""
    async with conveyor.connect(young_db, listen=False) as st:
        for start in range(0, 5000, 1000):
            await st.submit_many(
                [
                    {"name": "t", "queue": "q", "partition": f"p{i % 100}"}
                    for i in range(start, start + 1000)
                ]
            )
        leased = await st.claim("q", worker_id="w", limit=10, per_stream=1)
    assert len(leased) == 10
    items = json.dumps([[t.id, "w", "", t.attempt, "null"] for t in leased])
    plan = _explain(young_db, "ack_streams_lock", {"items": items})
    assert _rows_read(plan, "conveyor_tasks") <= 10


async def test_reading_acknowledged_tasks_back_looks_them_up_by_id(young_db: str) -> None:
    """succeed_many's read-back of 10 tasks (task_views) with 5,000 tasks and no
    statistics: 10 task rows and 10 delivery rows, each found by its key."""
    leased = await _fill(young_db)
    _no_statistics(young_db)
    ids = json.dumps([t.id for t in leased[:10]])
    plan = _explain(young_db, "task_views", {"ids": ids, "grp": ""})
    assert _rows_read(plan, "conveyor_tasks") <= 10
    assert _rows_read(plan, "conveyor_deliveries") <= 10
    assert plan["Plan"]["Actual Rows"] == 10


def _index_pages(url: str, names: list[str]) -> dict[str, int]:
    with psycopg.connect(_dsn(url)) as conn:
        return {
            name: conn.execute("SELECT pg_relation_size(%s) / 8192", [name]).fetchall()[0][0]
            for name in names
        }


async def test_a_claim_adds_nothing_to_the_status_and_roll_up_indexes(young_db: str) -> None:
    """Leasing 4,000 rows leaves the status and roll-up indexes as they were: a
    leased row's new version has no entry there (before: one in each, ~30 pages
    more per index). The acknowledgement then adds the finished rows."""
    names = ["ix_conveyor_deliveries_status", "ix_conveyor_deliveries_unrolled"]
    async with conveyor.connect(young_db, listen=False) as st:
        for start in range(0, QUEUED, 1000):
            batch = range(start, start + 1000)
            await st.submit_many([{"name": "t", "queue": "q", "payload": {"i": i}} for i in batch])
        before = _index_pages(young_db, names)
        leased: list[conveyor.Task] = []
        while len(leased) < QUEUED:
            leased += await st.claim("q", worker_id="w", limit=100)
        assert _index_pages(young_db, names) == before
        assert not any(
            await st.ack_many(
                [{"task_id": t.id, "worker_id": "w", "attempt": t.attempt} for t in leased]
            )
        )
        after = _index_pages(young_db, names)
        assert all(after[name] > before[name] for name in names)


def _plan_of(url: str, stmt: Any) -> dict[str, Any]:
    """The plan of a SQLAlchemy statement, its parameters written inline."""
    from sqlalchemy.dialects import postgresql

    sql = str(stmt.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
    with psycopg.connect(_dsn(url)) as conn:
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql).fetchone()
        conn.rollback()
    assert row is not None
    plan: dict[str, Any] = row[0][0]
    return plan


def _scans(plan: dict[str, Any]) -> list[tuple[str, str | None, int]]:
    """Every scan of conveyor_deliveries: node type, index, rows read (kept or not)."""
    return [
        (
            node["Node Type"],
            node.get("Index Name"),
            node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0),
        )
        for node in _nodes(plan["Plan"])
        if node.get("Relation Name") == "conveyor_deliveries" and "Scan" in node["Node Type"]
    ]


@pytest.mark.parametrize("analysed", [False, True])
async def test_listing_and_counting_by_status_read_only_their_rows(
    young_db: str, analysed: bool
) -> None:
    """With 4,000 queued and 1,000 leased rows, now that the status index leaves the
    leased rows out: listing them reads no more rows than there are leased (by
    their own index, or the first pages in submit order), listing the queued ones
    reads only queued rows, by index, and stats() still counts both: no plan walks
    the table, with or without statistics."""
    from conveyor.store.protocol import codec

    await _fill(young_db)
    if analysed:
        with psycopg.connect(_dsn(young_db), autocommit=True) as conn:
            conn.execute("ANALYZE")
    running = _scans(_plan_of(young_db, codec.list_statement("", "running", {}, None, 101)))
    assert running and all(kind != "Seq Scan" for kind, _, _ in running)
    assert sum(read for _, _, read in running) <= LEASED
    queued = _scans(_plan_of(young_db, codec.list_statement("", "queued", {}, None, 101)))
    assert queued and all(kind != "Seq Scan" for kind, _, _ in queued)
    assert sum(read for _, _, read in queued) <= QUEUED
    async with conveyor.connect(young_db, listen=False) as st:
        [stats] = await st.stats("q")
    assert (stats.counts["queued"], stats.counts["running"]) == (QUEUED, LEASED)


async def test_on_a_small_young_table_the_kept_connections_still_lease_by_index(
    young_db: str,
) -> None:
    """300 tasks, 100 leased, no statistics: planned as the store's kept connections
    plan them (pg_direct.NO_SEQSCAN), the claim's and the acknowledgement's UPDATEs
    read a handful of delivery rows. Planned by default they read the table whole,
    which is why those connections turn the whole-table scan off: a prepared
    statement keeps the plan it got on a young table as the table grows."""
    async with conveyor.connect(young_db, listen=False) as st:
        await st.submit_many([{"name": "t", "queue": "q", "payload": {"i": i}} for i in range(300)])
        leased = await st.claim("q", worker_id="w", limit=100)
        run = st._direct_runner()
        assert run is not None
        [(seqscan, jit)] = await run(
            "SELECT current_setting('enable_seqscan'), current_setting('jit')", {}
        )
    # JIT off too: priced-out scans made the waiters' upsert look costly enough to
    # compile, ~100 ms per wait().
    assert (seqscan, jit) == ("off", "off")
    _no_statistics(young_db)
    items = json.dumps([[t.id, "w", "", t.attempt, "null"] for t in leased[:1]])
    kept = pg_direct.NO_SEQSCAN
    assert _delivery_rows_read(_explain(young_db, "claim.one", _claim_params("w2"), kept)) <= 10
    ack = _explain(young_db, "ack_plain", {"items": items, "offset_us": 0}, kept)
    assert _delivery_rows_read(ack) <= 10
    by_default = _explain(young_db, "claim.one", _claim_params("w2"))
    assert _delivery_rows_read(by_default) >= 300  # what the setting is for


async def test_the_kept_connections_plan_each_statement_once(young_db: str) -> None:
    """Twenty claims of 50 in a row run on one kept connection: the claim is prepared
    there and every prepared run uses its one generic plan, none a plan made for its
    values. (The server's default plans the first five prepared runs for their
    values, and may go on doing so for every run: ~0.7 ms of planning per claim.)"""
    async with conveyor.connect(young_db, listen=False) as st:
        await st.submit_many(
            [{"name": "t", "queue": "q", "payload": {"i": i}} for i in range(2000)]
        )
        for _ in range(20):
            assert len(await st.claim("q", worker_id="w", limit=50)) == 50
        run = st._direct_runner()
        assert run is not None
        prepared = await run(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements", {}
        )
    claims = [row for row in prepared if "WITH flags" in row.statement]
    assert len(claims) == 1, [row.statement[:40] for row in prepared]
    [claim] = claims
    assert (claim.custom_plans, claim.generic_plans) == (0, 20 - postgres.PREPARE_THRESHOLD)


async def test_a_claim_of_stream_heads_reads_only_the_streams_it_takes(young_db: str) -> None:
    """claim(50, per_stream=2) with 3,000 free streams, planned generic as on the
    kept connections: the streams are read from their index in claim order and the
    reading stops at the 50 taken (revision 0008; before, all 3,000 were read and
    sorted), and each stream's rows are read once, never joined back to the streams
    row by row (before: every stream compared with every row, twice)."""
    async with conveyor.connect(young_db, listen=False) as st:
        await st.submit_many(
            [{"name": "t", "queue": "q", "partition": f"p{i % 3000}"} for i in range(6000)]
        )
    params = {**_claim_params("w"), "limit": 50, "per_stream": 2, "streams": 50, "mix": True}
    setup = pg_direct.NO_SEQSCAN
    plan = _explain(young_db, "claim.one", params, setup)
    assert plan["Plan"]["Actual Rows"] == 50
    # The free streams' scan and the held ones' lookups (one per stream taken).
    streams_read = sum(
        node["Actual Rows"] * node["Actual Loops"]
        for node in _nodes(plan["Plan"])
        if node.get("Relation Name") == "conveyor_streams" and "Scan" in node["Node Type"]
    )
    assert streams_read <= 120, streams_read
    srows_loops = [
        node["Actual Loops"] for node in _nodes(plan["Plan"]) if node.get("CTE Name") == "srows"
    ]
    assert srows_loops and max(srows_loops) <= 1, srows_loops


async def test_a_deep_page_of_a_workflow_reads_about_a_page(young_db: str) -> None:
    """The root index holds only tasks with a parent (revision 0007), so a submit
    of a root-level task writes no entry there; a workflow's page still reads
    about a page of tasks: its descendants in submit order from that index, its
    root by id. 3,000 descendants beside 3,000 other tasks, analysed (without
    statistics the first page is planned by guesses, as before the change)."""
    from conveyor.store.protocol import codec

    async with conveyor.connect(young_db, listen=False) as st:
        root = await st.submit("root", queue="wf")
        for _ in range(3):
            await st.submit_many([{"name": "c", "queue": "wf", "parent": root.id}] * 1000)
            await st.submit_many([{"name": "other", "queue": "wf"}] * 1000)
        first = await st.list(root_id=root.id, limit=100)
        deep = first
        for _ in range(20):
            assert deep.next_cursor is not None
            deep = await st.list(root_id=root.id, limit=100, cursor=deep.next_cursor)
    assert first.items[0].id == root.id
    with psycopg.connect(_dsn(young_db), autocommit=True) as conn:
        conn.execute("ANALYZE")
        [(entries,)] = conn.execute(
            "SELECT count(*) FROM conveyor_tasks WHERE parent_id IS NOT NULL"
        ).fetchall()
    assert entries == 3000  # what the root index holds
    filters: dict[str, str | None] = {"root_id": root.id}
    for cursor in (None, first.next_cursor, deep.next_cursor):
        plan = _plan_of(young_db, codec.list_statement("", None, filters, cursor, 101))
        read = sum(
            node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
            for node in _nodes(plan["Plan"])
            if node.get("Relation Name") == "conveyor_tasks" and "Scan" in node["Node Type"]
        )
        assert read <= 2 * 101, (cursor, read)


async def _planned_small_run_grown(
    url: str,
    name: str,
    params: dict[str, Any],
    table: str,
    first_rows: int,
    grow: Callable[[], Awaitable[None]],
) -> dict[str, Any]:
    """The plan of text ``name`` as a kept connection keeps it: prepared, planned
    generic at its first run (which must return ``first_rows`` rows) while the
    tables are small, then run with EXPLAIN ANALYZE after ``grow()``. Statistics
    of ``table`` taken meanwhile would make the server plan anew: autovacuum is
    off for it. Both runs are rolled back."""
    sql, names = pg_direct.native(pg_texts()[name])
    args = [params[n] for n in names]
    marks = ", ".join(["%s"] * len(args))
    with psycopg.connect(_dsn(url), autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
        conn.execute(pg_direct.NO_SEQSCAN)  # as on the kept connections
        conn.execute(f"PREPARE planned AS {sql}")
        cur = psycopg.ClientCursor(conn)
        conn.execute("BEGIN")
        cur.execute(f"EXECUTE planned({marks})", args)  # planned now, on few rows
        assert len(cur.fetchall()) == first_rows
        conn.execute("ROLLBACK")
        await grow()
        conn.execute("BEGIN")
        cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE planned({marks})", args)
        row = cur.fetchone()
        conn.execute("ROLLBACK")
    assert row is not None
    plan: dict[str, Any] = row[0][0]
    return plan


async def _submit(url: str, requests: list[dict[str, Any]]) -> None:
    async with conveyor.connect(url, listen=False) as st:
        for start in range(0, len(requests), 1000):
            await st.submit_many(requests[start : start + 1000])


async def test_a_claim_planned_on_few_streams_holds_its_streams_by_key_after_many_more(
    young_db: str,
) -> None:
    """The kept connections plan the claim once, generic, and keep the plan however
    the tables grow (no statistics change, nothing invalidates it). Planned while a
    queue had ten partitions, the claim must still mark the streams it took as held
    by looking each up by its primary key once the queue has 3,000 more: before,
    that plan read every stream of the group for them (68-94 ms per claim at 10,000
    partitions, against ~1.5 ms)."""
    await _submit(
        young_db, [{"name": "t", "queue": "q", "partition": f"p{i % 10}"} for i in range(40)]
    )
    params = {**_claim_params("w"), "limit": 20, "per_stream": 2, "streams": 20, "mix": True}
    more = [{"name": "t", "queue": "q", "partition": f"more{i}"} for i in range(3000)]
    plan = await _planned_small_run_grown(
        young_db, "claim.one", params, "conveyor_streams", 20, lambda: _submit(young_db, more)
    )
    assert plan["Plan"]["Actual Rows"] == 20
    held = [
        node
        for node in _nodes(plan["Plan"])
        if node.get("Node Type") == "ModifyTable"
        and node.get("Relation Name") == "conveyor_streams"
    ]
    assert len(held) == 1
    assert _rows_read({"Plan": held[0]}, "conveyor_streams") <= 20


async def test_children_find_their_parents_by_id(young_db: str) -> None:
    """The one-statement submit of children, planned generic on a near-empty table
    as the kept connections plan it, looks each parent up by its id once the table
    holds thousands of tasks: at most two reads of conveyor_tasks per child (the
    missing-parent check and the root), never a walk of the table."""
    async with conveyor.connect(young_db, listen=False) as st:
        parents = await st.submit_many([{"name": "p", "queue": "q"} for _ in range(3)])
    n = 50
    params: dict[str, Any] = {
        "ids": [f"child{i:021d}" for i in range(n)],
        "names": ["c"] * n,
        "queues": ["q"] * n,
        "payloads": ["null"] * n,
        "metadatas": ["{}"] * n,
        "priorities": [0] * n,
        "max_attempts": None,
        "backoffs": None,
        "delays": None,
        "run_ats": None,
        "correlation_ids": None,
        "parent_ids": [parents[i % 3].id for i in range(n)],
        "offset_us": 0,
    }
    more = [{"name": "t", "queue": "q"} for _ in range(5000)]
    plan = await _planned_small_run_grown(
        young_db, "submit_children", params, "conveyor_tasks", n, lambda: _submit(young_db, more)
    )
    assert plan["Plan"]["Actual Rows"] == n
    assert _rows_read(plan, "conveyor_tasks") <= 2 * n


BACKLOG = 50_000


def _relation_scans(plan: dict[str, Any], relation: str) -> list[tuple[str, str | None, int]]:
    """Every scan of ``relation``: node type, index, rows read (kept or filtered
    out) over all its loops."""
    return [
        (
            node["Node Type"],
            node.get("Index Name"),
            (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0))
            * node.get("Actual Loops", 1),
        )
        for node in _nodes(plan["Plan"])
        if node.get("Relation Name") == relation and "Scan" in node["Node Type"]
    ]


@pytest.mark.parametrize("analysed", [False, True])
async def test_a_groups_oldest_claimable_task_is_found_by_index_probes(
    young_db: str, analysed: bool
) -> None:
    """groups()' oldest claimable task of a group with 50,000 queued tasks over
    three priorities (and 2,000 free streams) is read from the ready index and
    the streams' index by a handful of probes (a skip scan over the priorities,
    then each one's first entry), never by reading the backlog, with or without
    statistics."""
    from conveyor.store.protocol import health
    from conveyor.store.protocol import transactions as tx

    async with conveyor.connect(young_db, listen=False) as st:
        await st.subscribe("q", "g", start="new")
        for start in range(0, BACKLOG, 5000):
            await st.submit_many(
                [
                    {"name": "t", "queue": "q", "priority": i % 3, "payload": i}
                    for i in range(start, start + 5000)
                ]
            )
        await st.submit_many(
            [{"name": "t", "queue": "q", "partition": f"p{i}"} for i in range(2000)]
        )
        st.clock_offset = 5.0
        [group] = await st.groups("q")
        now = await tx.run(st, lambda conn: tx.now_us(st, conn), write=False)
    assert group.lag == BACKLOG + 2000
    assert group.oldest_age is not None and group.oldest_age >= 5.0
    if analysed:
        with psycopg.connect(_dsn(young_db), autocommit=True) as conn:
            conn.execute("ANALYZE")
    plain, streamed = health.oldest_statements("q", "g", now)
    scans = _relation_scans(_plan_of(young_db, plain), "conveyor_deliveries")
    assert scans, "the plan reads no delivery rows"
    assert {index for _, index, _ in scans} == {"ix_conveyor_deliveries_ready"}, scans
    assert all(kind != "Seq Scan" for kind, _, _ in scans), scans
    # Three priorities: four steps of the skip scan, three first entries.
    assert sum(read for _, _, read in scans) <= 20, scans
    heads = _relation_scans(_plan_of(young_db, streamed), "conveyor_streams")
    assert {index for _, index, _ in heads} == {"ix_conveyor_streams_available"}, heads
    assert sum(read for _, _, read in heads) <= 20, heads
