"""Bulk actions by filter: retry, cancel or purge every row of one view (queue
mode or a group) of a queue that a filter selects.

A run walks the matching delivery rows in submit order (``task_seq``) with a
moving cursor, one bounded batch per transaction (:data:`BATCH` rows), up to the
last task the queue had when the run started: tasks submitted meanwhile are
not its business, and a row it queued again that fails again is not retried a
second time by the same run. Each batch is one of the one-task steps applied to
many rows (:func:`conveyor.store.protocol.withdraw.requeue`,
:func:`~conveyor.store.protocol.withdraw.withdraw_rows`,
:func:`conveyor.store.protocol.upkeep.delete_tasks`), in the lock order: the
batch's rows are read without locks, then their stream rows are locked, then the
delivery rows, whose conditions the writes check again. A run cut short leaves
the batches it committed and nothing half done; running it again does the rest
(what it did no longer matches).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import ColumnElement, exists, func, literal, select

from conveyor import _values as v
from conveyor.errors import InvalidArgument
from conveyor.schema import deliveries as d
from conveyor.schema import keys as k
from conveyor.schema import tasks as t
from conveyor.store.protocol import codec, streams, upkeep, wake, withdraw
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: Rows per transaction: bounded locks and a bounded statement, whatever the run.
BATCH = 500

Action = Literal["retry", "cancel", "purge"]

#: The statuses each action applies to; ``status=None`` means all of them.
STATUSES: dict[str, tuple[str, ...]] = {
    "retry": withdraw.RETRYABLE,
    "cancel": q.CANCELLABLE,
    "purge": upkeep.TERMINAL,
}


@dataclass(frozen=True, slots=True)
class Selection:
    """Which rows a bulk action is about, checked (see :func:`selection`)."""

    action: Action
    queue: str
    #: The view's delivery ``grp`` (``""``: queue mode).
    grp: str
    statuses: tuple[str, ...]
    name: str | None
    partition: str | None
    #: ``finished_after <= finished_at < finished_before``, in microseconds.
    after_us: int | None
    before_us: int | None
    #: At most this many rows changed (tasks deleted, for a purge); None: all.
    limit: int | None


def selection(
    action: Action,
    *,
    queue: Any,
    group: Any,
    status: Any,
    name: Any,
    partition: Any,
    finished_after: Any,
    finished_before: Any,
    limit: Any,
) -> Selection:
    """Check a bulk action's filters (InvalidArgument naming the field)."""
    queue = v.name("queue", queue)
    grp = codec.group_key(group)
    allowed = STATUSES[action]
    if status is None:
        statuses = allowed
    elif isinstance(status, str) and status in allowed:
        statuses = (str(status),)
    else:
        raise InvalidArgument(
            "status", f"{action}_where acts on {', '.join(allowed)} tasks, got {status!r}"
        )
    after = None if finished_after is None else v.aware("finished_after", finished_after)
    before = None if finished_before is None else v.aware("finished_before", finished_before)
    if action == "cancel":
        for field, value in (("finished_after", after), ("finished_before", before)):
            if value is not None:
                raise InvalidArgument(
                    field, "cancel_where acts on queued and running tasks, which have not finished"
                )
    if after is not None and before is not None and after > before:
        raise InvalidArgument("finished_after", "must not be later than finished_before")
    return Selection(
        action=action,
        queue=queue,
        grp=grp,
        statuses=statuses,
        name=v.opt_name("name", name),
        partition=v.opt_name("partition", partition),
        after_us=None if after is None else v.to_us(after),
        before_us=None if before is None else v.to_us(before),
        limit=None if limit is None else v.positive_int("limit", limit),
    )


def matching(
    sel: Selection, cursor: int | None = None, upto: int | None = None
) -> list[ColumnElement[bool]]:
    """The delivery rows ``sel`` selects, after ``cursor`` and up to ``upto``."""
    cond: list[ColumnElement[bool]] = [
        d.c.grp == sel.grp,
        d.c.queue == sel.queue,
        # Inline, not bound: both planners then match the partial status indexes.
        d.c.status.in_([literal(s, literal_execute=True) for s in sel.statuses]),
    ]
    if cursor is not None:
        cond.append(d.c.task_seq > cursor)
    if upto is not None:
        cond.append(d.c.task_seq <= upto)
    if sel.partition is not None:
        cond.append(d.c.partition == sel.partition)
    if sel.after_us is not None:
        cond.append(d.c.finished_at >= sel.after_us)
    if sel.before_us is not None:
        cond.append(d.c.finished_at < sel.before_us)
    if sel.name is not None:
        cond.append(
            d.c.task_seq.in_(select(t.c.seq).where(t.c.name == sel.name, t.c.queue == sel.queue))
        )
    if sel.action == "purge":
        # A task goes only once every one of its rows is finished.
        other = d.alias("other")
        cond.append(
            ~exists().where(other.c.task_seq == d.c.task_seq, other.c.status.in_(q.CANCELLABLE))
        )
    return cond


async def count_tx(conn: AsyncConnection, sel: Selection) -> int:
    """How many rows the action would change now (at most ``sel.limit``)."""
    rows = select(d.c.task_seq).where(*matching(sel))
    if sel.limit is not None:
        rows = rows.limit(sel.limit)
    return int((await conn.execute(select(func.count()).select_from(rows.subquery()))).scalar_one())


#: One batch: ``(connection, selection, cursor, size, upto)`` to ``(rows changed,
#: next cursor, whether more may follow)``.
Batch = Callable[["AsyncConnection", Selection, int, int, int], Awaitable[tuple[int, int, bool]]]


async def run(
    st: Seam, sel: Selection, batch: Batch, on_batch: Callable[[int], None] | None
) -> int:
    """Apply ``batch`` until the selection is done (or ``sel.limit`` rows changed);
    the rows changed. ``on_batch`` hears after each committed batch that changed
    rows how many."""
    upto = await tx.run(st, functools.partial(_last_seq, sel.queue), write=False)
    if upto is None:
        return 0
    cursor, total = 0, 0
    while sel.limit is None or total < sel.limit:
        size = BATCH if sel.limit is None else min(BATCH, sel.limit - total)
        changed, cursor, more = await tx.run(st, _one(batch, sel, cursor, size, upto))
        total += changed
        if changed:
            if sel.action != "purge":
                wake.wake_local(st, work=sel.action == "retry")
            if on_batch is not None:
                on_batch(changed)
        if not more:
            break
    return total


def _one(
    batch: Batch, sel: Selection, cursor: int, size: int, upto: int
) -> Callable[[AsyncConnection], Awaitable[tuple[int, int, bool]]]:
    async def work(conn: AsyncConnection) -> tuple[int, int, bool]:
        return await batch(conn, sel, cursor, size, upto)

    return work


async def _last_seq(queue: str, conn: AsyncConnection) -> int | None:
    found = await conn.execute(select(func.max(t.c.seq)).where(t.c.queue == queue))
    last = found.scalar()
    return None if last is None else int(last)


async def _candidates(
    conn: AsyncConnection, sel: Selection, cursor: int, size: int, upto: int
) -> list[int]:
    """The next ``size`` matching rows' tasks after ``cursor``, in submit order."""
    rows = await conn.execute(
        select(d.c.task_seq).where(*matching(sel, cursor, upto)).order_by(d.c.task_seq).limit(size)
    )
    return [int(seq) for seq in rows.scalars()]


def retrying(st: Seam, reset_attempts: bool) -> Batch:
    """One batch of retry_where: the one-task retry applied to the batch's rows."""

    async def batch(
        conn: AsyncConnection, sel: Selection, cursor: int, size: int, upto: int
    ) -> tuple[int, int, bool]:
        seqs = await _candidates(conn, sel, cursor, size, upto)
        if not seqs:
            return 0, cursor, False
        where = matching(sel, cursor, upto)
        changed = await withdraw.requeue(st, conn, sel.grp, seqs, where, reset_attempts)
        return changed, seqs[-1], len(seqs) == size

    return batch


def cancelling(st: Seam) -> Batch:
    """One batch of cancel_where: the view's rows of the batch withdrawn."""

    async def batch(
        conn: AsyncConnection, sel: Selection, cursor: int, size: int, upto: int
    ) -> tuple[int, int, bool]:
        seqs = await _candidates(conn, sel, cursor, size, upto)
        if not seqs:
            return 0, cursor, False
        await streams.lock_seq_streams(st, conn, seqs, sel.grp)  # the lock order
        where = [d.c.task_seq.in_(seqs), *matching(sel, cursor, upto)]
        changed = await withdraw.withdraw_rows(st, conn, where)
        return changed, seqs[-1], len(seqs) == size

    return batch


def purging(st: Seam) -> Batch:
    """One batch of purge_where: the batch's tasks finished for everyone deleted."""

    async def batch(
        conn: AsyncConnection, sel: Selection, cursor: int, size: int, upto: int
    ) -> tuple[int, int, bool]:
        seqs = await _candidates(conn, sel, cursor, size, upto)
        if not seqs:
            return 0, cursor, False
        doomed = await _lock_finished(st, conn, sel, seqs, cursor, upto)
        if doomed:
            await upkeep.delete_tasks(st, conn, doomed)
        return len(doomed), seqs[-1], len(seqs) == size

    return batch


async def _lock_finished(
    st: Seam, conn: AsyncConnection, sel: Selection, seqs: Sequence[int], cursor: int, upto: int
) -> list[int]:
    """Lock the keys, then every delivery row of the tasks ``seqs`` (the lock
    order), and return those still selected with every row finished: a retry
    committed since the candidates were read keeps its task."""
    ids = select(t.c.id).where(t.c.seq.in_(seqs))
    await conn.execute(
        st._lock_rows(
            select(k.c.key).where(k.c.task_id.in_(ids)).order_by(q.by_code_point(k.c.key))
        )
    )
    rows = await conn.execute(
        st._lock_rows(
            select(d.c.task_seq, d.c.status)
            .where(d.c.task_seq.in_(seqs))
            .order_by(d.c.task_seq, d.c.grp)
        )
    )
    active = {row.task_seq for row in rows if row.status in q.CANCELLABLE}
    still = await conn.execute(
        select(d.c.task_seq).where(d.c.task_seq.in_(seqs), *matching(sel, cursor, upto))
    )
    return sorted(seq for seq in still.scalars() if seq not in active)
