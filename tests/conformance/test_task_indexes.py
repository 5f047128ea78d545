"""The task table's lookups by parent and by correlation id use their indexes, which
hold only the tasks that have one (``WHERE parent_id IS NOT NULL``, ``WHERE
correlation_id IS NOT NULL``, revision 0005): the planner must see that
``col = :x`` implies ``col IS NOT NULL``. As in test_claim_cost, the plan is the
one the database chooses for the bound parameters (Postgres after ANALYZE, SQLite
without statistics); nothing is forced.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection
from tests._support import plan

from conveyor.schema import tasks as t
from conveyor.store.base import TaskStore
from conveyor.store.protocol import codec
from conveyor.store.protocol import queries as q

PARENT = "ix_conveyor_tasks_parent"
CORRELATION = "ix_conveyor_tasks_correlation_seq"
ROOT = "ix_conveyor_tasks_root_seq"


async def _load(store: TaskStore, backend: str) -> str:
    """3,000 tasks with neither, a few children and correlated tasks; a parent's id."""
    for _ in range(3):
        await store.submit_many([{"name": "plain", "queue": "q"} for _ in range(1_000)])
    parents = await store.submit_many([{"name": "p", "queue": "q"} for _ in range(5)])
    for p in parents:
        await store.submit_many([{"name": "c", "queue": "q", "parent": p} for _ in range(4)])
    await store.submit_many(
        [{"name": "r", "queue": "q", "correlation_id": f"c{n % 4}"} for n in range(20)]
    )
    if backend == "postgres":

        async def analyze(conn: AsyncConnection) -> None:
            await conn.execute(text("ANALYZE"))

        await store._run(analyze)
    return parents[2].id


def _assert_index(backend: str, text_plan: str, index: str) -> None:
    assert index in text_plan, f"{index} not used:\n{text_plan}"
    if backend == "sqlite":
        for line in text_plan.splitlines():
            assert not (line.startswith("SCAN conveyor_tasks") and "INDEX" not in line), text_plan
    else:
        assert "Seq Scan on conveyor_tasks" not in text_plan, text_plan


async def test_children_and_correlation_lookups_use_the_partial_indexes(
    store: TaskStore, backend: str
) -> None:
    parent = await _load(store, backend)
    children = q.task_view(q.QUEUE_MODE).where(t.c.parent_id == parent).order_by(t.c.seq)
    _assert_index(backend, await plan(store, children.limit(100)), PARENT)
    listed = codec.list_statement(
        q.QUEUE_MODE, None, {"correlation_id": "c1", "queue": None}, None, 101
    )
    _assert_index(backend, await plan(store, listed), CORRELATION)
    # And the answers are right.
    assert len(await store.children(parent)) == 4
    assert len((await store.list(correlation_id="c1")).items) == 5
    assert (await store.list(correlation_id="nobody")).items == []


async def test_a_workflow_listing_uses_the_root_index_of_descendants(
    store: TaskStore, backend: str
) -> None:
    """The root index holds only tasks with a parent (revision 0007): listing a
    workflow reads its descendants there and its root by id, on both backends."""
    root = await _load(store, backend)
    listed = codec.list_statement(q.QUEUE_MODE, None, {"root_id": root, "queue": None}, None, 101)
    text_plan = await plan(store, listed)
    _assert_index(backend, text_plan, ROOT)
    page = await store.list(root_id=root)
    assert page.items[0].id == root and len(page.items) == 5
