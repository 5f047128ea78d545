"""SQLite: the claim of streams and their acknowledgement run a fixed number of
statements however many streams they touch, each served by an index (never a
walk through the finished history)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from tests._support import sqlite_statements

import conveyor
from conveyor.store.base import TaskStore
from conveyor.store.protocol.transactions import InlineConnection

HISTORY_WALKS = {"y", "z", "r", "x", "d", "t", "s", "conveyor_deliveries", "conveyor_streams"}


def _count_statements(store: TaskStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the store runs from now on: through SQLAlchemy, or on the
    driver's cursor (the built-once texts)."""
    seen = sqlite_statements(store)
    for name in ("run_text", "run_text_many"):
        run = getattr(InlineConnection, name)

        def counted(self: InlineConnection, sql: str, *args: Any, _run: Any = run) -> Any:
            seen.append(sql)
            return _run(self, sql, *args)

        monkeypatch.setattr(InlineConnection, name, counted)
    return seen


async def _statements_for(
    path: Path, streams: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, int, int]:
    async with conveyor.connect(f"sqlite:///{path}") as store:
        await store.submit_many(
            [
                {"name": "t", "queue": "q", "partition": f"p{i % streams}"}
                for i in range(2 * streams)
            ]
        )
        seen = _count_statements(store, monkeypatch)
        claimed = await store.claim("q", worker_id="w", limit=streams, per_stream=1)
        assert sorted(task.partition or "" for task in claimed) == sorted(
            f"p{i}" for i in range(streams)
        )
        claim_statements = len(seen)
        seen.clear()
        errors = await store.ack_many(
            [{"task_id": task.id, "worker_id": "w", "attempt": task.attempt} for task in claimed],
            partitioned=True,
        )
        assert errors == [None] * streams
        ack_statements = len(seen)
        # Each stream's next task is claimable now.
        again = await store.claim("q", worker_id="w", limit=streams, per_stream=1)
        return claim_statements, ack_statements, len(again)


async def test_statements_do_not_grow_with_the_streams_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    few = await _statements_for(tmp_path / "few.db", 2, monkeypatch)
    with monkeypatch.context() as again:
        many = await _statements_for(tmp_path / "many.db", 20, again)
    assert few[:2] == many[:2], (few, many)
    assert few[2] == 2 and many[2] == 20


async def test_the_claim_statements_probe_indexes(tmp_path: Path) -> None:
    path = tmp_path / "plan.db"
    async with conveyor.connect(f"sqlite:///{path}") as store:
        await store.open()
        assert store._texts is not None
        params: dict[str, Any] = {
            "grp": "",
            "queue": "q",
            "partition": None,
            "limit": 10,
            "streams": 10,
            "per_stream": 2,
            "now_us": 0,
            "seqs": "[1, 2]",
            "w_id": "w",
            "lease": None,
            "partitions": '["p"]',
            "keys": '[["q", "", "p"]]',
            "flow": False,
        }
        names = [
            "claim.candidates",
            "claim.lease",
            "claim.view",
            "claim.hold",
            "refresh_streams",
        ]
        with closing(sqlite3.connect(path)) as db:
            for name in names:
                text = store._texts.get(name)
                assert text is not None, name
                bound = {**text.fixed, **params}
                plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + text.sql, bound)]
                walks = [
                    step
                    for step in plan
                    if step.startswith("SCAN ") and step.split()[1] in HISTORY_WALKS
                ]
                assert walks == [], (name, plan)
                assert not any("ix_conveyor_deliveries_status (grp=?)" in s for s in plan), plan


async def test_a_streams_running_check_reads_leased_rows_not_its_backlog(tmp_path: Path) -> None:
    """Whether a stream has a leased row is looked up among the queue's leased rows,
    never by walking the stream's active rows: with nothing leased, that read the
    whole backlog on every acknowledgement of the stream (4.4 ms for 20,000 queued
    tasks). So in every statement that recomputes streams."""
    path = tmp_path / "running.db"
    params = {
        "refresh_streams": {"keys": '[["q", "", "p"]]'},
        "refresh_group_streams": {"pairs": '[["q", "p"]]'},
        "replace_refresh": {"key": "k", "id": "i"},
    }
    async with conveyor.connect(f"sqlite:///{path}") as store:
        await store.open()
        assert store._texts is not None
        texts = {name: store._texts[name] for name in params}
    with closing(sqlite3.connect(path)) as db:
        for name, text in texts.items():
            bound = {**params[name], "now_us": 0}
            plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + text.sql, bound)]
            [check] = [s for s in plan if s.startswith("SEARCH r ")]
            assert "ix_conveyor_deliveries_stream" not in check, (name, plan)
            assert "status=?" in check or "ix_conveyor_deliveries_leased" in check, (name, plan)


async def test_the_claim_reads_free_streams_in_claim_order(tmp_path: Path) -> None:
    """With 3,000 free streams, the claim's candidates take the fairest streams in
    the order of the streams' index (revision 0008): no sort of every free stream
    (before: a temporary B-tree over all 3,000, ~0.6 ms a claim)."""
    path = tmp_path / "streams.db"
    async with conveyor.connect(f"sqlite:///{path}") as store:
        await store.submit_many(
            [{"name": "t", "queue": "q", "partition": f"p{i % 3000}"} for i in range(6000)]
        )
        assert store._texts is not None
        text = store._texts.get("claim.candidates")
        assert text is not None
    params = {
        "grp": "",
        "queue": "q",
        "partition": None,
        "limit": 50,
        "streams": 50,
        "per_stream": 2,
        "now_us": 2**62,
        "flow": False,
    }
    with closing(sqlite3.connect(path)) as db:
        plan = db.execute("EXPLAIN QUERY PLAN " + text.sql, params).fetchall()
        rows = db.execute(text.sql, params).fetchall()
    # The steps under the free streams' subquery (id, parent, _, step).
    [free] = [node for node, _, _, step in plan if step == "MATERIALIZE free"]
    steps = [(node, step) for node, parent, _, step in plan if parent == free]
    assert [step for _, step in steps] == [
        "SEARCH s USING INDEX ix_conveyor_streams_available (grp=? AND queue=?)",
        # The pause check (store.pause): run once, one probe of its primary key.
        "SCALAR SUBQUERY 1",
        # The flow-control check (revision 0018): run once, one probe of the
        # queue's settings row.
        "SCALAR SUBQUERY 2",
    ], plan
    [paused] = [step for _, parent, _, step in plan if parent == steps[1][0]]
    assert paused.startswith("SEARCH c USING COVERING INDEX sqlite_autoindex_conveyor_pauses"), plan
    [held] = [step for _, parent, _, step in plan if parent == steps[2][0]]
    assert held.startswith("SEARCH l USING INDEX sqlite_autoindex_conveyor_queues"), plan
    # The first 50 streams in claim order (equal priority: the longest waiting, then
    # by partition), two rows each.
    assert len([row for row in rows if row[0] == 1]) == 100


async def test_a_partitioned_submit_writes_its_streams_in_a_fixed_number_of_statements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partitioned submit writes stream rows in the protocol's statements, the
    same number however many streams it joins: the queue-mode streams created
    before the insert (``lock_streams``: with one writer there is nothing to lock),
    then the partitions' streams of queue mode and every group created and
    recomputed (``lock_group_streams``, ``refresh_group_streams``), as on Postgres.
    The streams come out right: each partition's tasks claimed in submit order."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 's.db'}") as store:
        await store.submit("t", queue="q")
        seen = _count_statements(store, monkeypatch)
        first = await store.submit("t", queue="q", partition="new")
        one = [s for s in seen if "conveyor_streams" in s and "INSERT" in s.upper()]
        seen.clear()
        batch = await store.submit_many(
            [{"name": "t", "queue": "q", "partition": p} for p in ("new", "other", "other")]
        )
        two = [s for s in seen if "conveyor_streams" in s and "INSERT" in s.upper()]
        assert store._texts is not None
        names = ("lock_streams", "lock_group_streams", "refresh_group_streams")
        assert one == two == [store._texts[name].sql for name in names]
        got = await store.claim("q", worker_id="w", limit=10, per_stream=3)
        by_stream = (
            [t.id for t in got if t.partition == "new"],
            [t.id for t in got if t.partition == "other"],
        )
        assert by_stream == ([first.id, batch[0].id], [batch[1].id, batch[2].id])
