"""Queue depth limits (``configure_queue(q, max_depth=N)``): a submit that would
leave more than N tasks queued in a queue raises :class:`~conveyor.QueueFull`
and writes nothing.

Exact under concurrent producers, by going step by step for a capped queue:

1. Every one-statement submit refuses a queue with a ``max_depth`` (its SQL
   reads the queue's settings row anyway): the store's own statements raise,
   which the dialect classifies (:meth:`~conveyor.store.seam.Seam._is_capped`)
   and :func:`conveyor.store.protocol.transactions.run` turns into
   :class:`Capped`, the transaction rolled back; the four a caller's transaction
   runs without a savepoint write nothing instead, and the answers missing say
   the same (:func:`conveyor.store.protocol.producer.answers`).
2. The submit then goes step by step
   (:func:`conveyor.store.protocol.producer.submit_tx`), which first locks the
   settings rows of the capped queues among its requests (``depth_lock``: on
   Postgres ``FOR UPDATE``, on SQLite the write lock), then counts their queued
   tasks (``depth_count``, a statement of its own, so on Postgres it sees what
   the producer before it committed), and raises QueueFull where the count and
   the new tasks exceed the limit, before anything is written.

The lock order gains its first item: the settings rows of capped queues, in
queue order, before keys. Nothing else locks a settings row while holding other
locks (``configure_queue`` locks that row alone).

The store remembers which queues were capped when it last looked
(``Seam._capped``), and sends their submits step by step at once instead of
trying the one-statement submit first; the statements' refusal keeps that
memory honest when another process sets a limit meanwhile.

A task sent to a dead-letter queue (:mod:`.dead_letters`) is never refused: a
failure must always be recorded. A keyed submit is counted as a new task before
its key is looked at, so at the limit a submit whose key would reuse an existing
task is refused too.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING

from conveyor.errors import QueueFull
from conveyor.store.protocol import texts
from conveyor.store.protocol.requests import Request
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class Capped(Exception):
    """A one-statement submit met a queue with a ``max_depth`` and wrote nothing:
    the submit goes step by step (never leaves the store)."""


def known_capped(st: Seam, reqs: list[Request]) -> bool:
    """Whether some of ``reqs`` go to a queue this store last saw capped."""
    return bool(st._capped) and any(r.queue in st._capped for r in reqs)


async def check(st: Seam, conn: AsyncConnection, reqs: list[Request]) -> None:
    """Before a step-by-step submit of ``reqs`` writes anything: lock the capped
    queues' settings rows, count their queued tasks, and raise
    :class:`~conveyor.QueueFull` for the first (by name) that the new tasks would
    take past its limit."""
    queues = sorted({r.queue for r in reqs})
    built = texts.on(st, conn)
    rows = await texts.execute(conn, st, built["depth_lock"], {"queues": json.dumps(queues)})
    limits = {row.queue: int(row.max_depth) for row in rows}
    st._capped.difference_update(queues)
    st._capped.update(limits)
    if not limits:
        return
    counted = await texts.execute(
        conn, st, built["depth_count"], {"queues": json.dumps(sorted(limits))}
    )
    depths = {row.queue: int(row.n) for row in counted}
    adding = Counter(r.queue for r in reqs)
    for queue in sorted(limits):
        if depths.get(queue, 0) + adding[queue] > limits[queue]:
            raise QueueFull(queue, depths.get(queue, 0), limits[queue])
