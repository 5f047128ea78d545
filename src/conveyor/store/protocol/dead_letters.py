"""Dead-letter queues: a delivery that fails for good (attempts exhausted,
``Permanent``, its lease lost on the last attempt) or is evicted sends a new task
to its queue's ``dead_letter`` queue, in the same transaction.

The new task carries the original's name, payload, priority and correlation id,
its ``parent_id`` is the original (``store.children(original)`` finds it), and
``metadata["dead_letter"]`` says what happened: ``task_id``, ``queue``, ``group``
(``None`` for queue mode), ``status`` (``"failed"`` or ``"evicted"``), ``error``,
``attempts`` and ``failed_at``. One per task and group: each group's failure is
its own. It goes in unpartitioned and without a key (a dead-letter queue is read
by people and by whatever requeues its tasks, not by the original's streams).

It is written as any submit writes (:func:`conveyor.store.protocol.producer.insert_tasks`),
at the end of the failing transaction, after the original's streams were locked
and recomputed: the lock order of a producer (streams, then the new task rows)
is kept, as a queue's dead-letter queue is never the queue itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, tuple_

from conveyor import _values as v
from conveyor.encryption import is_sealed
from conveyor.schema import deliveries as d
from conveyor.schema import queues as qs
from conveyor.schema import tasks as t
from conveyor.store.protocol import producer, sealing
from conveyor.store.protocol.requests import Request
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


async def send(st: Seam, conn: AsyncConnection, rows: Sequence[tuple[int, str]]) -> int:
    """For each ``(task_seq, grp)`` delivery row that has just failed for good or
    been evicted, a task in its queue's dead-letter queue (where the queue has
    one); how many were written."""
    if not rows:
        return 0
    found = list(
        await conn.execute(
            select(
                t.c.id,
                t.c.name,
                t.c.queue,
                t.c.partition,
                t.c.payload,
                t.c.metadata,
                t.c.priority,
                t.c.correlation_id,
                d.c.grp,
                d.c.status,
                d.c.error,
                d.c.attempt,
                d.c.finished_at,
                qs.c.dead_letter,
            )
            .select_from(d.join(t, t.c.seq == d.c.task_seq).join(qs, qs.c.queue == t.c.queue))
            .where(
                tuple_(d.c.task_seq, d.c.grp).in_(sorted(set(rows))),
                qs.c.dead_letter.is_not(None),
            )
            .order_by(d.c.task_seq, d.c.grp)
        )
    )
    if not found:
        return 0
    reqs = [_request(st, row) for row in found]
    await producer.insert_tasks(st, conn, reqs)
    await st._notify(conn, {r.queue for r in reqs}, done=False)
    return len(reqs)


def _request(st: Seam, row: Any) -> Request:
    """The dead-letter task of one failed or evicted delivery row. The values of a
    sealed original are opened (DecryptionError without its key) and the letter
    sealed, whatever its own queue's setting: a letter never holds in plain text
    what its original held sealed."""
    keyring = st._keyring
    sealed = is_sealed(row.payload)
    payload = sealing.open_text(keyring, row.payload, row.id, "payload") if sealed else row.payload
    metadata = sealing.load(keyring, row.metadata, row.id, "metadata") if row.metadata else {}
    metadata["dead_letter"] = {
        "task_id": row.id,
        "queue": row.queue,
        "group": row.grp or None,
        "partition": row.partition,
        "status": row.status,
        "error": None if row.error is None else sealing.load(keyring, row.error, row.id, "error"),
        "attempts": row.attempt,
        "failed_at": None if row.finished_at is None else v.from_us(row.finished_at).isoformat(),
    }
    return Request(
        id=v.new_task_id(),
        name=row.name,
        payload=payload,
        queue=row.dead_letter,
        priority=row.priority,
        delay_us=None,
        run_at_us=None,
        max_attempts=None,
        backoff=None,
        key=None,
        conflict="reuse",
        partition=None,
        parent_id=row.id,
        correlation_id=row.correlation_id,
        metadata=json.dumps(metadata),
        seal=sealed,
    )


__all__ = ["send"]
