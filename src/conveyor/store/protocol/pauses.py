"""Pause and resume: a queue, or one consumer group of it, whose claims lease
nothing for a while (maintenance, a broken downstream), while submits go on.

A pause is a row of ``conveyor_pauses`` (``grp`` ``''``: the whole queue, every
consumer of it; else that group alone). The claim statements of both dialects
and the idle workers' claimable probe read that table, so a pause holds for
every process from its commit on, and a worker of a paused queue sleeps instead
of polling. ``resume`` deletes the row and announces the queue, so the idle
workers of every process look again at once rather than at their next poll.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import and_, delete, select

from conveyor.errors import NotFound
from conveyor.schema import groups as g
from conveyor.schema import pauses as p
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: The ``grp`` of a whole queue's pause (queue mode's own ``grp``: group names
#: are never empty).
WHOLE_QUEUE = q.QUEUE_MODE


async def pause_tx(st: Seam, conn: AsyncConnection, queue: str, group: str | None) -> bool:
    """Pause ``queue`` (``group`` None) or one group of it; True if it was not
    paused so already. A group must be subscribed to the queue."""
    if group is not None:
        await _check_group(conn, queue, group)
    now = await tx.now_us(st, conn)
    grp = WHOLE_QUEUE if group is None else group
    inserted = await conn.execute(
        st._upsert(p)
        .values(queue=queue, grp=grp, paused_at=now)
        .on_conflict_do_nothing(index_elements=["queue", "grp"])
        .returning(p.c.paused_at)
    )
    return inserted.first() is not None


async def resume_tx(st: Seam, conn: AsyncConnection, queue: str, group: str | None) -> bool:
    """Lift the pause of ``queue`` (``group`` None) or of one group of it; True if
    it was paused so. The idle workers of the queue are woken at commit."""
    if group is not None:
        await _check_group(conn, queue, group)
    grp = WHOLE_QUEUE if group is None else group
    removed = await conn.execute(
        delete(p).where(p.c.queue == queue, p.c.grp == grp).returning(p.c.paused_at)
    )
    if removed.first() is None:
        return False
    await st._notify(conn, {queue}, done=False)
    return True


async def paused_tx(
    conn: AsyncConnection, queues: Sequence[str] | None = None
) -> dict[tuple[str, str], int]:
    """The pauses of ``queues`` (all: ``None``) by ``(queue, grp)``, each with the
    moment it began (µs); ``grp`` ``''`` is the whole queue's."""
    stmt = select(p.c.queue, p.c.grp, p.c.paused_at)
    if queues is not None:
        stmt = stmt.where(p.c.queue.in_(list(queues)))
    return {(r.queue, r.grp): r.paused_at for r in await conn.execute(stmt)}


def is_paused(pauses: dict[tuple[str, str], int], queue: str, grp: str) -> bool:
    """Whether claims of ``queue`` by ``grp`` (queue mode: ``''``) lease nothing."""
    return (queue, WHOLE_QUEUE) in pauses or (queue, grp) in pauses


async def _check_group(conn: AsyncConnection, queue: str, group: str) -> None:
    row = (
        await conn.execute(select(g.c.active).where(and_(g.c.queue == queue, g.c.name == group)))
    ).first()
    if row is None or not row.active:
        raise NotFound(
            f"group {group!r} on queue {queue!r}",
            hint="only a subscribed group can be paused or resumed: "
            "`conveyor groups list` shows the groups",
        )
