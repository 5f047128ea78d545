"""Streams: the FIFO state machine of partitioned work.

A stream is the tasks of one (queue, group, partition), delivered in submit
order. Its row in ``conveyor_streams`` holds the head (first active task) and
``available_at``: set when the head is queued and due and no task of the
stream is leased, ``NULL`` otherwise. Claims pick the fairest available stream
by index; every transition of a partitioned delivery row recomputes its
stream with :func:`refresh`.

The lock order — one for the whole protocol, so the store never deadlocks with
itself. Every transaction takes its locks in this order:

1. table barriers (only a subscribe takes them: :meth:`Seam._lock_for_backfill`);
2. idempotency key rows, sorted by key (producers);
3. consumer-group rows (producers share them, unsubscribe locks them);
4. stream rows, sorted by (grp, queue, partition) — queue mode's ``grp ''`` sorts
   first, which is why producers may lock their queue-mode rows early;
5. delivery rows.

Keys are sorted by code point, as Python sorts ``str``, in SQL too
(:func:`conveyor.store.protocol.queries.by_code_point`, ``COLLATE "C"`` in Postgres texts):
a database collation such as ICU's ``en-US`` sorts ``'a'`` before ``'B'``, and
a lock statement ordered by it would take two streams in the opposite order of
one whose keys Python sorted.

Every change of a partitioned delivery row's status moves its stream, so the
stream row is locked before the delivery row. Where only the delivery rows tell
which streams are involved, the protocol reads them first without locks (a
task's queue and partition never change), locks the streams with
:func:`lock_streams` / :func:`lock_task_streams`, and only then updates the
delivery rows, re-checking its conditions. A claim picks its stream with
``SKIP LOCKED`` before taking delivery rows; lease recovery, cancel, retry,
fail, succeed, release, eviction and unsubscribe all lock streams first.
Heartbeat and progress touch one delivery row and no stream.

A stream row is locked before its head is read, so a transition committed
meanwhile is seen and no stale head is written back. Producers of a stream
serialise on its queue-mode stream row (:func:`serialize_producers`) before
inserting, so within a stream the sequence order is the commit order.
On SQLite one writer holds the whole database and the order is moot: its
``share_groups`` and ``lock_streams`` lock nothing (the second creates the rows
missing), and the reads that only find the streams of a replace's holders or of
a fenced write to lock ahead are skipped (``row_locks`` is False).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import false, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.schema import streams as s
from conveyor.schema import tasks as t
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import texts
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam


async def serialize_producers(
    st: Seam, conn: AsyncConnection, keys: Iterable[tuple[str, str]]
) -> None:
    """Lock the queue-mode stream rows of the (queue, partition) streams a producer
    is about to add to, creating them as needed; held until commit (on SQLite,
    whose one writer already makes the sequence order the commit order, only
    created)."""
    stream_keys = sorted(set(keys))
    if not stream_keys:
        return
    built = texts.usable(st, conn, "lock_streams")
    if built is not None:
        # The same lock as below, built once: queue mode's grp sorts first, so
        # (queue, partition) order is the lock order of these rows.
        keys_json = json.dumps([[qn, q.QUEUE_MODE, p] for qn, p in stream_keys])
        await texts.execute(conn, st, built, {"keys": keys_json})
        return
    lock = st._upsert(s).values(
        [{"queue": qn, "grp": q.QUEUE_MODE, "partition": p} for qn, p in stream_keys]
    )
    # Updates nothing, but Postgres still locks the conflicting row.
    lock = lock.on_conflict_do_update(
        index_elements=["queue", "grp", "partition"],
        set_={"head_seq": lock.excluded.head_seq},
        where=false(),
    )
    await conn.execute(lock)


async def lock_or_create(
    st: Seam, conn: AsyncConnection, keys: Iterable[tuple[str, str, str]]
) -> None:
    """Lock the (queue, grp, partition) stream rows ``keys`` in the lock order,
    creating those that do not exist, in one statement (``lock_streams``); held
    until commit. On a caller's connection the statement cannot run on, the rows
    that exist are locked (the missing ones are created later, as producers create
    them)."""
    ordered = sorted(set(keys), key=lock_order)
    if not ordered:
        return
    built = texts.usable(st, conn, "lock_streams")
    if built is not None:
        await texts.execute(conn, st, built, {"keys": json.dumps([list(k) for k in ordered])})
    else:
        await lock_streams(st, conn, ordered)


def lock_order(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """Sort key of a (queue, grp, partition) stream in the lock order."""
    queue, grp, partition = key
    return (grp, queue, partition)


async def lock_streams(st: Seam, conn: AsyncConnection, keys: Iterable[tuple[Any, ...]]) -> None:
    """Lock the existing stream rows of (queue, grp, partition) ``keys`` (unpartitioned
    ones are ignored), in the lock order, before any delivery row of them."""
    wanted = sorted({(grp, queue, p) for queue, grp, p in keys if p is not None})
    if wanted:
        await conn.execute(st._lock_rows(q.stream_rows_of(wanted)))


async def lock_task_streams(
    st: Seam, conn: AsyncConnection, task_ids: Iterable[str], grp: str | None
) -> None:
    """Lock the stream rows of the given tasks' partitions — every group's, or
    ``grp``'s — in the lock order, before their delivery rows."""
    rows = await conn.execute(
        select(t.c.queue, t.c.partition).where(
            t.c.id.in_(sorted(set(task_ids))), t.c.partition.is_not(None)
        )
    )
    pairs = sorted({(row.queue, row.partition) for row in rows})
    if pairs:
        await conn.execute(st._lock_rows(q.partition_streams(pairs, grp)))


async def refresh(st: Seam, conn: AsyncConnection, keys: Iterable[tuple[Any, ...]]) -> bool:
    """Recompute head and availability of each (queue, group, partition) stream;
    whether one of them is available now where it was not (or may be: a stream
    the statement wrote without changing its availability counts too), which is
    when idle claimers have something new to find.

    A stream is available when its first active task is queued and due and no
    task of it is leased. ``available_at`` records when the current head became
    available, which is what fair stream selection orders by.

    Every stream is recomputed by one statement (``refresh_streams``), after
    another has locked their rows in the lock order, creating the missing ones
    (``lock_streams``): two statements however many streams. The steps below,
    three or four per stream, serve a caller's connection the statements cannot
    run on.
    """
    built = texts.usable(st, conn, "refresh_streams")
    lock = texts.usable(st, conn, "lock_streams")
    if built is not None and lock is not None:
        ordered = sorted(set(keys), key=lock_order)
        if ordered:
            params = {"keys": json.dumps([list(key) for key in ordered])}
            # Its own statement: the refresh's snapshot then has every change
            # committed to these streams before their locks were granted.
            await texts.execute(conn, st, lock, params)
            rows = await texts.execute(conn, st, built, params)
            return any(row.available_at is not None for row in rows)
        return False
    freed = False
    for queue, grp, partition in sorted(set(keys), key=lock_order):
        # Lock the stream row before reading its head: a transition committed by
        # another transaction while we wait is then visible to the reads below,
        # so nobody writes back a head computed from a stale view.
        locked = st._lock_rows(q.stream_state(queue, grp, partition))
        state = (await conn.execute(locked)).first()
        if state is None:
            await conn.execute(
                st._upsert(s)
                .values(queue=queue, grp=grp, partition=partition)
                .on_conflict_do_nothing(index_elements=["queue", "grp", "partition"])
            )
            state = (await conn.execute(locked)).first()
        head = (await conn.execute(q.stream_head(queue, grp, partition, tx.now(st)))).first()
        available: int | None = None
        head_seq = None if head is None else head.task_seq
        priority = None if head is None else head.priority
        if head is not None and head.status == q.QUEUED:
            held = (await conn.execute(q.stream_running(queue, grp, partition))).scalar()
            if not held:
                if state is not None and state.head_seq == head_seq and state.available_at:
                    available = max(state.available_at, head.run_at)
                else:
                    available = max(head.now, head.run_at)
        if state is None or (state.head_seq, state.available_at) != (head_seq, available):
            freed = freed or available is not None
            await conn.execute(
                update(s)
                .where(s.c.queue == queue, s.c.grp == grp, s.c.partition == partition)
                .values(head_seq=head_seq, priority=priority, available_at=available)
            )
    return freed
