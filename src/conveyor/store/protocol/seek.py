"""Seek: move a consumer group's position in its queue, to replay its tasks
from a point or to skip what waits before it.

``seek(queue, group, to=...)`` acts on the group's delivery rows only (queue
mode and the other groups never change). Tasks created at or after ``to``
(``"start"``: all retained) that have finished for the group are queued again
afresh: attempts counted anew, result, error and progress cleared. Tasks
created before ``to`` (``"end"``: every task) still queued for the group become
``skipped``, a terminal status. A delivery leased to a worker is left to finish
as it was, neither requeued nor skipped (counted in ``left_running``).

A run, like a bulk action (:mod:`conveyor.store.protocol.bulk`), walks the rows
in submit order with a moving cursor, one bounded batch per transaction
(:data:`BATCH` rows), up to the last task the queue had when it started: tasks
submitted meanwhile are queued as usual and not its business. Each batch takes
the locks in the lock order: the group rows shared (an unsubscribe waits), the
batch's stream rows, then its delivery rows, whose conditions the writes check
again; each recomputes the streams it changed (:func:`streams.refresh`).

Three passes, in this order:

1. **skip**: the queued rows before the point become ``skipped``;
2. **replay**: the finished rows from the point are queued again;
3. **release**: the rows the replay parked become due.

FIFO across batches. A partition's replayed rows may fall in several batches,
and a claimer runs between them: queued again at once, the first batch's rows
would be delivered, then the stream's tasks already queued after them (new
ones, say), and only then the rows a later batch queues again, which come
before those in submit order. So a replay of more than one batch queues its
partitioned rows *parked*: due at :data:`PARKED`, far in the future. A parked
head holds its stream (``available_at`` is its run_at, see
``refresh_streams``), so nothing of a partition after its first replayed task
is delivered until the release pass makes the parked rows due, again in
ascending batches: a stream then runs up to its next parked row and waits there
for the next batch. A replay of one batch needs none of this (one transaction:
nothing runs between its rows) and queues every row due now. Unpartitioned rows
carry no order and are never parked.

A run cut short (the process killed, the database gone) keeps what its batches
committed; its parked rows wait, held, until the same seek is run again: every
run's release pass makes the parked rows of its scope due. Two seeks of one
group at once are not meant to be: the release of one would free the other's
parked rows before its replay is done.

While a run of several batches goes on, claimers still take what it has not
reached yet; a task delivered that way before its batch comes is queued again
by it if it finished by then, and left running (counted) if not.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, case, func, literal, select, update

from conveyor import _values as v
from conveyor.errors import InvalidArgument, NotFound
from conveyor.models import SeekResult
from conveyor.schema import deliveries as d
from conveyor.schema import groups as g
from conveyor.schema import tasks as t
from conveyor.store.protocol import producer, streams, upkeep, wake, withdraw
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: Rows per transaction: bounded locks and a bounded statement, whatever the run.
BATCH = 500

#: The run_at of a partitioned row a replay of several batches queued again,
#: until its release pass (9999-12-31 UTC: never due by itself).
PARKED = v.to_us(datetime(9999, 12, 31, tzinfo=UTC))

#: ``to="start"`` and ``to="end"`` as a point in microseconds: every task is
#: created at or after the first, and before the second.
START = -1
END = 2**63 - 1

SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Seek:
    """A seek's arguments, checked (see :func:`target`)."""

    queue: str
    group: str
    #: Tasks created at or after this (microseconds) are replayed; queued ones
    #: before it skipped.
    point: int
    partition: str | None


def target(queue: Any, group: Any, to: Any, partition: Any) -> Seek:
    """Check a seek's arguments (InvalidArgument naming the field)."""
    queue = v.name("queue", queue)
    group = v.name("group", group)
    if isinstance(to, datetime):
        point = v.to_us(v.aware("to", to))
    elif isinstance(to, str) and to in ("start", "end"):
        point = START if to == "start" else END
    else:
        raise InvalidArgument(
            "to",
            f'must be an aware datetime, "start" (replay every retained task) or "end" '
            f"(skip every queued task), got {to!r}",
        )
    return Seek(queue=queue, group=group, point=point, partition=v.opt_name("partition", partition))


async def run(st: Seam, sk: Seek) -> SeekResult:
    """Run the seek ``sk`` (see the module docs); what it did."""
    upto = await tx.run(st, functools.partial(_start, sk), write=False)
    skipped = requeued = held = busy = 0
    if upto is not None:
        if sk.point > START:
            skipped, held = await _walk(st, sk, 0, upto, _skipping(st), work=False)
        if sk.point < END:
            first = await tx.run(st, functools.partial(_first_replayed, sk, upto), write=False)
            if first is not None:
                replay = _replaying(st, first - 1)
                requeued, busy = await _walk(st, sk, first - 1, upto, replay, work=True)
        # Not counted: the rows it releases were counted as requeued when parked.
        await _walk(st, sk, 0, upto, _releasing(st), work=True)
    return SeekResult(
        queue=sk.queue,
        group=sk.group,
        partition=sk.partition,
        requeued=requeued,
        skipped=skipped,
        left_running=held + busy,
    )


async def _start(sk: Seek, conn: AsyncConnection) -> int | None:
    """The group must be subscribed (NotFound if not); the queue's last task."""
    await _check_group(conn, sk)
    found = await conn.execute(select(func.max(t.c.seq)).where(t.c.queue == sk.queue))
    last = found.scalar()
    return None if last is None else int(last)


async def _check_group(conn: AsyncConnection, sk: Seek) -> None:
    row = (
        await conn.execute(select(g.c.active).where(g.c.queue == sk.queue, g.c.name == sk.group))
    ).first()
    if row is None or not row.active:
        raise NotFound(
            f"group {sk.group!r} on queue {sk.queue!r}",
            hint="a seek moves a subscribed group: subscribe it first"
            if row is None
            else "it was unsubscribed; subscribe() starts it over",
        )


async def _first_replayed(sk: Seek, upto: int, conn: AsyncConnection) -> int | None:
    """The first task of the queue created at or after the point: where the
    replay's walk starts (the tasks index in submit order, read until the first;
    written as ORDER BY ... LIMIT 1, which both planners stop early on)."""
    stmt = select(t.c.seq).where(t.c.queue == sk.queue, t.c.seq <= upto)
    if sk.point > START:
        stmt = stmt.where(t.c.created_at >= sk.point)
    found = (await conn.execute(stmt.order_by(t.c.seq).limit(1))).scalar()
    return None if found is None else int(found)


#: One batch: ``(connection, seek, cursor, size, upto)`` to ``(rows changed,
#: rows left running, next cursor, whether more may follow)``.
Batch = Callable[["AsyncConnection", Seek, int, int, int], Awaitable[tuple[int, int, int, bool]]]


async def _walk(
    st: Seam, sk: Seek, cursor: int, upto: int, batch: Batch, *, work: bool
) -> tuple[int, int]:
    """Apply ``batch`` from ``cursor`` until the walk reaches ``upto``; the rows
    changed and the rows left running. ``work``: whether the rows it changes
    are work for idle workers here (else only ``wait()`` calls look again)."""
    changed = running = 0
    while True:
        step = functools.partial(_batch, st, batch, sk, cursor, upto)
        n, busy, cursor, more = await tx.run(st, step)
        changed, running = changed + n, running + busy
        if n:
            wake.wake_local(st, work=work)
        if not more:
            return changed, running


async def _batch(
    st: Seam, batch: Batch, sk: Seek, cursor: int, upto: int, conn: AsyncConnection
) -> tuple[int, int, int, bool]:
    # The lock order: the queue's group rows shared first (as producers share
    # them), so an unsubscribe waits for the batch and the batch sees it after.
    await producer.share_groups(st, conn, [sk.queue])
    await _check_group(conn, sk)
    return await batch(conn, sk, cursor, BATCH, upto)


def _rows(
    sk: Seek, cursor: int, upto: int, statuses: Sequence[str], created: ColumnElement[bool] | None
) -> list[ColumnElement[bool]]:
    """The group's rows of the seek's scope in ``statuses``, after ``cursor`` and
    up to ``upto``, of tasks whose creation meets ``created`` (the statement
    joins the task rows: :func:`_candidates`)."""
    cond: list[ColumnElement[bool]] = [
        d.c.grp == sk.group,
        d.c.queue == sk.queue,
        # Inline, not bound: both planners then match the partial status indexes
        # (one status as ``=``, which SQLite matches to an index's WHERE).
        q.is_status(statuses[0])
        if len(statuses) == 1
        else d.c.status.in_([literal(s, literal_execute=True) for s in statuses]),
        d.c.task_seq > cursor,
        d.c.task_seq <= upto,
    ]
    if sk.partition is not None:
        cond.append(d.c.partition == sk.partition)
    if created is not None:
        cond.append(created)
    return cond


def _joined() -> Any:
    """The delivery rows beside their tasks (their creation time)."""
    return d.join(t, t.c.seq == d.c.task_seq)


async def _candidates(
    conn: AsyncConnection, cond: Sequence[ColumnElement[bool]], size: int
) -> list[int]:
    """The next ``size`` rows ``cond`` selects, in submit order."""
    rows = await conn.execute(
        select(d.c.task_seq).select_from(_joined()).where(*cond).order_by(d.c.task_seq).limit(size)
    )
    return [int(seq) for seq in rows.scalars()]


async def _running(
    conn: AsyncConnection,
    sk: Seek,
    cursor: int,
    found: Sequence[int],
    size: int,
    upto: int,
    created: ColumnElement[bool] | None,
) -> tuple[int, int, bool]:
    """Where a batch that read ``found`` ends — ``(last seq, whether more may
    follow)`` — and how many rows of its range are leased, which the seek leaves
    to finish (counted from the leased rows' index: few, whatever the history)."""
    more = len(found) == size
    last = found[-1] if more else upto
    cond = _rows(sk, cursor, last, (q.RUNNING,), created)
    busy = await conn.execute(select(func.count()).select_from(_joined()).where(*cond))
    return int(busy.scalar_one()), last, more


def _skipping(st: Seam) -> Batch:
    """One batch of the skip pass: the queued rows before the point skipped."""

    async def batch(
        conn: AsyncConnection, sk: Seek, cursor: int, size: int, upto: int
    ) -> tuple[int, int, int, bool]:
        before = t.c.created_at < sk.point if sk.point < END else None
        seqs = await _candidates(conn, _rows(sk, cursor, upto, (q.QUEUED,), before), size)
        running, last, more = await _running(conn, sk, cursor, seqs, size, upto, before)
        changed = 0
        if seqs:
            await streams.lock_seq_streams(st, conn, seqs, sk.group)  # the lock order
            rows = await conn.execute(
                update(d)
                .where(d.c.task_seq.in_(seqs), d.c.grp == sk.group, q.is_status(q.QUEUED))
                .values(status=SKIPPED, finished_at=tx.now(st), lease_expires_at=None)
                .returning(d.c.queue, d.c.grp, d.c.partition)
            )
            done = list(rows)
            await streams.refresh(st, conn, [tuple(r) for r in done if r.partition is not None])
            if done:
                # Finished for the group: a wait() for it returns.
                await st._notify(conn, {sk.queue}, done=True)
            changed = len(done)
        return changed, running, last, more

    return batch


def _replaying(st: Seam, start: int) -> Batch:
    """One batch of the replay pass: the finished rows from the point queued again
    afresh, partitioned ones parked unless this batch is the whole replay."""

    async def batch(
        conn: AsyncConnection, sk: Seek, cursor: int, size: int, upto: int
    ) -> tuple[int, int, int, bool]:
        since = t.c.created_at >= sk.point if sk.point > START else None
        seqs = await _candidates(conn, _rows(sk, cursor, upto, upkeep.TERMINAL, since), size)
        running, last, more = await _running(conn, sk, cursor, seqs, size, upto, since)
        changed = 0
        if seqs:
            alone = cursor == start and not more
            # The whole replay in this one transaction: every row is due now.
            # Else partitioned rows wait, parked, for the release pass (see the
            # module docs).
            run_at = None if alone else case((d.c.partition.is_(None), tx.now(st)), else_=PARKED)
            terminal = [d.c.status.in_([literal(s, literal_execute=True) for s in upkeep.TERMINAL])]
            changed = await withdraw.requeue(
                st, conn, sk.group, seqs, terminal, True, fresh=True, run_at=run_at
            )
        return changed, running, last, more

    return batch


def _releasing(st: Seam) -> Batch:
    """One batch of the release pass: parked rows made due, in submit order."""

    async def batch(
        conn: AsyncConnection, sk: Seek, cursor: int, size: int, upto: int
    ) -> tuple[int, int, int, bool]:
        cond = [*_rows(sk, cursor, upto, (q.QUEUED,), None), d.c.run_at == PARKED]
        seqs = await _candidates(conn, cond, size)
        if not seqs:
            return 0, 0, cursor, False
        await streams.lock_seq_streams(st, conn, seqs, sk.group)  # the lock order
        rows = await conn.execute(
            update(d)
            .where(
                d.c.task_seq.in_(seqs),
                d.c.grp == sk.group,
                q.is_status(q.QUEUED),
                d.c.run_at == PARKED,
            )
            .values(run_at=tx.now(st))
            .returning(d.c.queue, d.c.grp, d.c.partition)
        )
        done = list(rows)
        keys = [tuple(r) for r in done if r.partition is not None]
        await streams.refresh_moved_up(st, conn, keys)
        if done:
            await st._notify(conn, {sk.queue}, done=False)
        return len(done), 0, seqs[-1], len(seqs) == size

    return batch


async def preview_tx(sk: Seek, conn: AsyncConnection) -> SeekResult:
    """What the seek would do now, written nowhere: the rows it would queue
    again, skip, and leave running (the group must be subscribed)."""
    upto = await _start(sk, conn)
    counts = {"requeued": 0, "skipped": 0, "left_running": 0}
    if upto is not None:
        before = t.c.created_at < sk.point if sk.point < END else None
        since = t.c.created_at >= sk.point if sk.point > START else None
        wanted: list[tuple[str, Sequence[str], ColumnElement[bool] | None]] = [
            ("left_running", (q.RUNNING,), None)
        ]
        if sk.point > START:
            wanted.append(("skipped", (q.QUEUED,), before))
        if sk.point < END:
            wanted.append(("requeued", upkeep.TERMINAL, since))
        for field, statuses, created in wanted:
            cond = _rows(sk, 0, upto, statuses, created)
            found = await conn.execute(select(func.count()).select_from(_joined()).where(*cond))
            counts[field] = int(found.scalar_one())
    return SeekResult(queue=sk.queue, group=sk.group, partition=sk.partition, **counts)
