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
missing).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, select, tuple_, update

from conveyor.schema import streams as s
from conveyor.schema import tasks as t
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import texts
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


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
    # Queue mode's grp sorts first, so (queue, partition) order is the lock order
    # of these rows.
    keys_list = [[qn, q.QUEUE_MODE, p] for qn, p in stream_keys]
    await texts.execute(conn, st, texts.on(st, conn)["lock_streams"], {"keys": keys_list})


async def lock_or_create(
    st: Seam, conn: AsyncConnection, keys: Iterable[tuple[str, str, str]]
) -> None:
    """Lock the (queue, grp, partition) stream rows ``keys`` in the lock order,
    creating those that do not exist, in one statement (``lock_streams``); held
    until commit."""
    ordered = sorted(set(keys), key=lock_order)
    if not ordered:
        return
    built = texts.on(st, conn)["lock_streams"]
    await texts.execute(conn, st, built, {"keys": [list(k) for k in ordered]})


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
    await _lock_partitions(st, conn, t.c.id.in_(sorted(set(task_ids))), grp)


async def lock_seq_streams(
    st: Seam, conn: AsyncConnection, seqs: Iterable[int], grp: str | None
) -> None:
    """:func:`lock_task_streams` for tasks named by their sequence numbers."""
    await _lock_partitions(st, conn, t.c.seq.in_(sorted(set(seqs))), grp)


async def _lock_partitions(
    st: Seam, conn: AsyncConnection, tasks: ColumnElement[bool], grp: str | None
) -> None:
    rows = await conn.execute(
        select(t.c.queue, t.c.partition).where(tasks, t.c.partition.is_not(None))
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
    (``lock_streams``): two statements however many streams.
    """
    ordered = sorted(set(keys), key=lock_order)
    if not ordered:
        return False
    built = texts.on(st, conn)
    params = {"keys": json.dumps([list(key) for key in ordered])}
    # Its own statement: the refresh's snapshot then has every change committed to
    # these streams before their locks were granted.
    await texts.execute(conn, st, built["lock_streams"], params)
    rows = await texts.execute(conn, st, built["refresh_streams"], params)
    return any(row.available_at is not None for row in rows)


async def quiet(st: Seam, conn: AsyncConnection, pairs: Iterable[tuple[str, str]]) -> None:
    """After a submit wrote tasks to the ``(queue, partition)`` pairs and locked
    their streams: those of a queue with a ``debounce`` wait out its quiet period
    from now (``quiet_streams``); the recompute keeps them waiting until then."""
    ordered = sorted(set(pairs))
    if ordered:
        params = {"pairs": json.dumps([list(pair) for pair in ordered])}
        await texts.execute(conn, st, texts.on(st, conn)["quiet_streams"], params)


async def refresh_moved_up(
    st: Seam, conn: AsyncConnection, keys: Iterable[tuple[Any, ...]]
) -> bool:
    """:func:`refresh` for locked streams whose head may have been made due
    earlier than its run_at was (a seek's parked rows released): ``refresh``
    keeps the ``available_at`` of a stream whose head did not change, as fair
    order needs when a head's wait only grows, so these streams' is cleared
    first and recomputed from their head's run_at now."""
    ordered = sorted({(grp, queue, p) for queue, grp, p in keys})
    if ordered:
        await conn.execute(
            update(s)
            .where(tuple_(s.c.grp, s.c.queue, s.c.partition).in_(ordered))
            .values(available_at=None)
        )
    return await refresh(st, conn, keys)
