"""The operator's cancel and retry of tasks already submitted: withdrawing a task
for queue mode and every group (also a replaced idempotency key's holder), and
queueing a finished row of a group again. Both lock the streams first (the lock
order, :mod:`conveyor.store.protocol.streams`) and recompute them after.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.models import Task
from conveyor.schema import deliveries as d
from conveyor.schema import tasks as t
from conveyor.store.protocol import codec, streams, upkeep
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam


async def cancel_tx(st: Seam, conn: AsyncConnection, task_ids: Sequence[str]) -> None:
    """Withdraw the tasks for queue mode and every group (active rows only)."""
    await streams.lock_task_streams(st, conn, task_ids, None)  # the lock order
    now = tx.now(st)
    rows = await conn.execute(
        update(d)
        .where(
            d.c.task_seq.in_(select(t.c.seq).where(t.c.id.in_(task_ids))),
            d.c.status.in_(q.ACTIVE),
        )
        .values(status="cancelled", finished_at=now, lease_expires_at=None)
        .returning(d.c.queue, d.c.grp, d.c.partition)
    )
    changed = list(rows)
    await streams.refresh(st, conn, [tuple(r) for r in changed if r.partition is not None])
    if changed:
        await st._notify(conn, {r.queue for r in changed}, done=True, task_ids=task_ids)


async def retry_tx(
    st: Seam, conn: AsyncConnection, task_id: str, grp: str, reset_attempts: bool
) -> Task | None:
    """Queue a failed, cancelled or evicted row of ``grp`` again; the task as ``grp``
    sees it afterwards (``None`` if unknown)."""
    now = tx.now(st)
    values: dict[str, Any] = {
        "status": q.QUEUED,
        "run_at": now,
        "finished_at": None,
        "lease_expires_at": None,
        "worker_id": None,
    }
    if reset_attempts:
        # A fresh budget of the task's max_attempts, counted on from the current
        # attempt: attempt numbers never repeat, so the fence of a stale run can
        # never match a newer one.
        budget = select(t.c.max_attempts).where(t.c.seq == d.c.task_seq)
        values["max_attempts"] = d.c.attempt + budget.scalar_subquery()
    retryable = (
        d.c.task_seq == q.task_seq_of(task_id),
        d.c.grp == grp,
        d.c.status.in_(("failed", "cancelled", "evicted")),
    )
    await streams.lock_task_streams(st, conn, [task_id], grp)  # the lock order
    # A finished row already rolled up into the counts leaves them again.
    before = (
        await conn.execute(
            st._lock_rows(select(d.c.queue, d.c.status, d.c.rolled).where(*retryable))
        )
    ).first()
    if before is not None and before.rolled:
        await upkeep.add_counts(st, conn, {(before.queue, grp, before.status): -1})
    rows = list(
        await conn.execute(
            update(d)
            .where(*retryable)
            .values(rolled=0, **values)
            .returning(d.c.queue, d.c.grp, d.c.partition)
        )
    )
    await streams.refresh(st, conn, [tuple(r) for r in rows if r.partition is not None])
    if rows:
        await st._notify(conn, {rows[0].queue}, done=False)
    return (await codec.fetch_tasks(conn, grp, ids=[task_id])).get(task_id)
