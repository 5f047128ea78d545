"""The operator's cancel and retry of tasks already submitted: withdrawing a task
for queue mode and every group (also a replaced idempotency key's holder), and
queueing a finished row of a group again. Both lock the streams first (the lock
order, :mod:`conveyor.store.protocol.streams`) and recompute them after.

The row-level steps, :func:`withdraw_rows` and :func:`requeue`, serve one task
(``cancel``, ``retry``) and the bulk actions by filter alike
(:mod:`conveyor.store.protocol.bulk`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, select, update

from conveyor.models import Task
from conveyor.schema import deliveries as d
from conveyor.schema import tasks as t
from conveyor.store.protocol import codec, streams, upkeep
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: The statuses retry() queues again (``skipped``, like ``cancelled``: an
#: operator's decision that another can undo).
RETRYABLE = ("failed", "cancelled", "evicted", "skipped")


async def cancel_tx(st: Seam, conn: AsyncConnection, task_ids: Sequence[str]) -> None:
    """Withdraw the tasks for queue mode and every group (active rows only)."""
    await streams.lock_task_streams(st, conn, task_ids, None)  # the lock order
    seqs = select(t.c.seq).where(t.c.id.in_(task_ids))
    await withdraw_rows(
        st, conn, [d.c.task_seq.in_(seqs), d.c.status.in_(q.CANCELLABLE)], task_ids=task_ids
    )


async def withdraw_rows(
    st: Seam,
    conn: AsyncConnection,
    where: Sequence[ColumnElement[bool]],
    *,
    task_ids: Iterable[str] = (),
) -> int:
    """Cancel the delivery rows ``where`` selects, which the caller holds to active
    rows and whose streams it has locked; how many changed. ``task_ids``: the
    tasks, for their waiters (none: every waiter looks again)."""
    now = tx.now(st)
    rows = await conn.execute(
        update(d)
        .where(*where)
        .values(status="cancelled", finished_at=now, lease_expires_at=None)
        .returning(d.c.queue, d.c.grp, d.c.partition)
    )
    changed = list(rows)
    await streams.refresh(st, conn, [tuple(r) for r in changed if r.partition is not None])
    if changed:
        await st._notify(conn, {r.queue for r in changed}, done=True, task_ids=task_ids)
    return len(changed)


async def retry_tx(
    st: Seam, conn: AsyncConnection, task_id: str, grp: str, reset_attempts: bool
) -> Task | None:
    """Queue a failed, cancelled, evicted or skipped row of ``grp`` again; the task as ``grp``
    sees it afterwards (``None`` if unknown)."""
    seq = (await conn.execute(select(t.c.seq).where(t.c.id == task_id))).scalar()
    if seq is None:
        return None
    await requeue(st, conn, grp, [seq], [d.c.status.in_(RETRYABLE)], reset_attempts)
    return (await codec.fetch_tasks(conn, grp, ids=[task_id], keyring=st._keyring)).get(task_id)


async def requeue(
    st: Seam,
    conn: AsyncConnection,
    grp: str,
    seqs: Sequence[int],
    where: Sequence[ColumnElement[bool]],
    reset_attempts: bool,
    *,
    fresh: bool = False,
    run_at: ColumnElement[Any] | None = None,
) -> int:
    """Queue again the rows of ``grp`` of the tasks ``seqs`` that meet ``where``
    (finished rows: the caller's conditions say which); how many changed. Locks
    their streams, then the rows, and recomputes the streams after.

    ``fresh`` also clears what the earlier deliveries left (result, error,
    progress, first start), as a seek's replay does; ``run_at`` (SQL) replaces
    the default of now."""
    now = tx.now(st)
    values: dict[str, Any] = {
        "status": q.QUEUED,
        "run_at": now if run_at is None else run_at,
        "finished_at": None,
        "lease_expires_at": None,
        "worker_id": None,
    }
    if fresh:
        values.update(
            result=None, error=None, progress=None, progress_message=None, started_at=None
        )
    if reset_attempts:
        # A fresh budget of the task's max_attempts, counted on from the current
        # attempt: attempt numbers never repeat, so the fence of a stale run can
        # never match a newer one.
        budget = select(t.c.max_attempts).where(t.c.seq == d.c.task_seq)
        values["max_attempts"] = d.c.attempt + budget.scalar_subquery()
    retryable = (d.c.task_seq.in_(sorted(set(seqs))), d.c.grp == grp, *where)
    await streams.lock_seq_streams(st, conn, seqs, grp)  # the lock order
    # Finished rows already rolled up into the counts leave them again. Locked
    # here, so a roll-up cannot count a row between this read and the update.
    before = await conn.execute(
        st._lock_rows(
            select(d.c.queue, d.c.status, d.c.rolled).where(*retryable).order_by(d.c.task_seq)
        )
    )
    deltas: dict[tuple[str, str, str], int] = {}
    for row in before:
        if row.rolled:
            key = (row.queue, grp, row.status)
            deltas[key] = deltas.get(key, 0) - 1
    await upkeep.add_counts(st, conn, deltas)
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
        await st._notify(conn, {r.queue for r in rows}, done=False)
    return len(rows)
