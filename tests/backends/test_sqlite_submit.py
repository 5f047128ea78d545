"""SQLite: a submit of children (tasks with a parent, no key or partition) runs on
the statements built once, as a plain submit does: the parents' roots read, the
clock and settings, the rows; nothing built by SQLAlchemy per call."""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from tests._support import sqlite_statements

import conveyor
from conveyor.store.sqlite.connection import register_functions


async def test_children_go_through_the_built_statements(tmp_path: Path) -> None:
    """A child alone and a batch of children and a task without parent: no
    SQLAlchemy statement (before: the whole step-by-step submit); each answer has
    its parent and its parent's root, as the store reads it back."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 's.db'}") as store:
        root = await store.submit("root", queue="q")
        await store.submit("warm", queue="q", parent=root)
        seen = sqlite_statements(store)
        child = await store.submit("child", queue="q", parent=root, priority=2)
        batch = await store.submit_many(
            [
                {"name": "grandchild", "queue": "q", "parent": child.id},
                {"name": "alone", "queue": "q"},
                {"name": "sibling", "queue": "other", "parent": root.id},
            ]
        )
        assert seen == []
        assert (child.parent_id, child.root_id, child.priority) == (root.id, root.id, 2)
        grandchild, alone, sibling = batch
        assert (grandchild.parent_id, grandchild.root_id) == (child.id, root.id)
        assert (alone.parent_id, alone.root_id) == (None, alone.id)
        assert (sibling.parent_id, sibling.root_id) == (root.id, root.id)
        for task in (child, *batch):
            assert task == await store.get(task.id)


async def test_a_missing_parent_writes_nothing(tmp_path: Path) -> None:
    """One unknown parent in a batch of children: the error names it, and no task
    of the batch is written."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 's.db'}") as store:
        root = await store.submit("root", queue="q")
        with pytest.raises(conveyor.InvalidArgument) as bad:
            await store.submit_many(
                [
                    {"name": "ok", "queue": "q", "parent": root.id},
                    {"name": "lost", "queue": "q", "parent": "01ARZ3NDEKTSV4RRFFQ69G5FAZ"},
                ]
            )
        assert bad.value.field == "parent" and "01ARZ3NDEKTSV4RRFFQ69G5FAZ" in str(bad.value)
        with pytest.raises(conveyor.InvalidArgument):
            await store.submit("lost", queue="q", parent="01ARZ3NDEKTSV4RRFFQ69G5FAZ")
        [stats] = await store.stats("q")
        assert stats.counts["queued"] == 1


async def test_partitioned_tasks_go_through_the_built_statements(tmp_path: Path) -> None:
    """Partitioned tasks without keys, alone and in a batch, in a queue with a
    consumer group: no SQLAlchemy statement (before: the step-by-step submit), and
    every stream they joined, queue mode's and the group's, is recomputed: each
    hands out its tasks in submit order."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 's.db'}") as store:
        await store.subscribe("q", "audit")
        await store.submit("warm", queue="q", partition="w")
        seen = sqlite_statements(store)
        first = await store.submit("t", queue="q", partition="a")
        batch = await store.submit_many(
            [
                {"name": "t", "queue": "q", "partition": "b"},
                {"name": "t", "queue": "q", "partition": "a"},
                {"name": "t", "queue": "q"},
                {"name": "t", "queue": "q", "partition": "b", "parent": first.id},
            ]
        )
        assert seen == []
        assert [t.partition for t in batch] == ["b", "a", None, "b"]
        assert batch[3].root_id == first.id
        for task in (first, *batch):
            assert task == await store.get(task.id)
        order = {"a": [first.id, batch[1].id], "b": [batch[0].id, batch[3].id]}
        for group in (None, "audit"):
            got: dict[str, list[str]] = {"a": [], "b": []}
            for _ in range(4):
                claimed = await store.claim("q", worker_id="w", group=group, limit=10)
                for task in claimed:
                    if task.partition in got:
                        got[task.partition].append(task.id)
                    await store.succeed(task.id, worker_id="w", group=group)
            assert got == order


async def test_keyed_tasks_are_written_by_the_built_statements(tmp_path: Path) -> None:
    """A keyed submit claims its keys step by step, then writes its new tasks with
    the built statements of a plain submit: no SQLAlchemy statement writes a task
    or delivery row (before: a multi-row INSERT and the fan-out built per call).
    New keys make tasks with their key, a held key answers with its holder, and a
    replaced holder is withdrawn."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 's.db'}") as store:
        held = await store.submit("t", queue="q", key="held")
        seen = sqlite_statements(store)
        one = await store.submit("t", queue="q", key="one", partition="p")
        batch = await store.submit_many(
            [
                {"name": "t", "queue": "q", "key": "held"},
                {"name": "t", "queue": "q", "key": "two", "parent": one.id},
            ]
        )
        swapped = await store.submit("t", queue="q", key="held", conflict="replace")
        writes = [s for s in seen if "INSERT INTO conveyor_tasks" in s or "deliveries" in s]
        assert [s for s in writes if "INSERT" in s] == []
        assert (one.key, one.partition) == ("one", "p")
        assert batch[0].id == held.id and batch[1].key == "two"
        assert batch[1].root_id == one.id
        for task in (one, batch[1], swapped):
            assert task == await store.get(task.id) == await store.get_by_key(task.key or "")
        gone = await store.get(held.id)
        assert gone is not None and gone.status is conveyor.Status.CANCELLED


async def test_keys_are_claimed_and_read_by_the_built_statements(tmp_path: Path) -> None:
    """Keyed submits (new keys, held ones, a key twice in a batch, a replace) claim
    and read their keys with the built statements: no statement through
    SQLAlchemy names the keys table, the replace's hand-over included (before: an
    upsert compiled anew on every call, about 40 % of a keyed submit's time).
    One task per key, a held key answering with its holder."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 's.db'}") as store:
        held = await store.submit("t", queue="q", key="held")
        seen = sqlite_statements(store)
        one = await store.submit("t", queue="q", key="one")
        again = await store.submit("t", queue="q", key="one", partition="p")
        batch = await store.submit_many(
            [
                {"name": "t", "queue": "q", "key": "held"},
                {"name": "t", "queue": "q", "key": "new"},
                {"name": "t", "queue": "q", "key": "new"},
            ]
        )
        swapped = await store.submit("t", queue="q", key="one", conflict="replace")
        keyed = [s for s in seen if "conveyor_keys" in s]
        assert keyed == []
        assert again == one and batch[0].id == held.id and batch[1] == batch[2]
        assert await store.get_by_key("new") == batch[1]
        assert await store.get_by_key("one") == swapped != one
        with pytest.raises(conveyor.AlreadyExists):
            await store.submit("t", queue="q", key="held", conflict="reject")


def _traced(store: conveyor.TaskStore) -> list[str]:
    """Every statement the store's connection runs from now on, as SQLite expands it."""
    thread: Any = store._connection_runner()
    raw = thread._conn.connection.driver_connection
    seen: list[str] = []
    raw.set_trace_callback(seen.append)
    return seen


def _ran(seen: list[str], *transactions: tuple[str, ...]) -> bool:
    """Whether ``seen`` (but the wake-up's ``PRAGMA`` reads) is the statements of
    each of ``transactions``, in order, each in a write transaction of its own (a
    statement known by its text up to its first parameter)."""
    wanted: list[str] = []
    for statements in transactions:
        wanted += ["BEGIN IMMEDIATE", *[s[: s.index(":")] for s in statements], "COMMIT"]
    ran = [s for s in seen if not s.startswith("PRAGMA")]
    if len(ran) != len(wanted):
        return False
    return all(s.startswith(w) for s, w in zip(ran, wanted, strict=True))


async def test_plain_submits_and_children_are_the_dialects_one_statement(tmp_path: Path) -> None:
    """One task, a batch, a child, children, and a batch large enough to go in runs:
    each is the catalogue's statement of its kind (a script of SQLite's), in one
    transaction, nothing else (before: steps chosen because the dialect had no
    such statement)."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 's.db'}") as store:
        root = await store.submit("root", queue="q")
        built: Any = store._texts
        seen = _traced(store)
        await store.submit("t", queue="q")
        assert _ran(seen, built["submit_one"].statements)
        seen.clear()
        await store.submit_many([{"name": "t", "queue": "q"}, {"name": "t", "queue": "r"}])
        assert _ran(seen, built["submit_plain"].statements)
        seen.clear()
        await store.submit("c", queue="q", parent=root)
        await store.submit_many([{"name": "c", "queue": "q", "parent": root.id}] * 2)
        assert _ran(seen, built["submit_child"].statements, built["submit_children"].statements)
        seen.clear()
        big = await store.submit_many(
            [{"name": "t", "queue": "q", "payload": i} for i in range(300)]
        )
        # Two runs (50, then 250) in one transaction.
        assert _ran(seen, built["submit_plain"].statements * 2)
        assert [t.payload for t in big] == list(range(300))
        assert big[-1] == await store.get(big[-1].id)


async def test_the_submit_statements_read_no_table_whole(tmp_path: Path) -> None:
    """Each statement of the submit's scripts finds its rows by index: what it scans
    is only its JSON lists and constant rows, never the tasks, delivery or stream
    rows (left to choose, the planner read every delivery row to find the streams
    an ``insert_rows`` joined: 140 µs per keyed task at 2,000 tasks)."""
    path = tmp_path / "plan.db"
    names = [
        "submit_one",
        "submit_child",
        "submit_plain",
        "submit_children",
        "insert_rows",
        "lock_streams",
        "share_groups",
        "parent_roots",
        "submit_context",
    ]
    async with conveyor.connect(f"sqlite:///{path}") as store:
        await store.open()
        built: Any = store._texts
    with closing(sqlite3.connect(path)) as db:
        register_functions(db)  # conveyor_capped, which the submits call
        for name in names:
            for sql in built[name].statements:
                params = dict.fromkeys(re.findall(r"(?<![:\w]):(\w+)", sql))
                plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql, params)]
                scans = [
                    step
                    for step in plan
                    if step.startswith("SCAN ")
                    and "VIRTUAL TABLE" not in step
                    and step not in ("SCAN CONSTANT ROW", "SCAN one")
                ]
                assert scans == [], (name, plan)
