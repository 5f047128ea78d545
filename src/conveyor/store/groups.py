"""Consumer groups (bus mode): registering a group, backfilling its delivery rows
from the retained history, and dropping its state when it unsubscribes.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor import _values as v
from conveyor import statements as q
from conveyor.models import ConsumerGroup
from conveyor.schema import deliveries as d
from conveyor.schema import groups as g
from conveyor.store import codec, streams
from conveyor.store import transactions as tx
from conveyor.store.seam import Seam


async def subscribe(
    st: Seam,
    queue: str,
    group: str,
    *,
    new: bool,
    start_at: int | None,
    if_missing: bool,
) -> ConsumerGroup:
    """Register ``group`` on ``queue`` from now (``new``), from ``start_at`` (in
    microseconds) or from the retained history (neither), then backfill its
    delivery rows in a second transaction behind the producer barrier."""

    async def register(conn: AsyncConnection) -> tuple[ConsumerGroup, bool]:
        row = (await conn.execute(select(g).where(g.c.queue == queue, g.c.name == group))).first()
        if row is not None and (row.active or if_missing):
            # An unsubscribed group stays so until subscribe() is called: a stray
            # worker's claim must not bring it back and replay the history.
            return codec.group_row(row), False
        now = await tx.now_us(st, conn)
        begin = now if new else start_at
        if row is None:
            await conn.execute(
                g.insert().values(
                    queue=queue, name=group, start_at=begin, created_at=now, active=True
                )
            )
        else:
            await conn.execute(
                update(g)
                .where(g.c.queue == queue, g.c.name == group)
                .values(start_at=begin, created_at=now, active=True)
            )
        fresh = (await conn.execute(select(g).where(g.c.queue == queue, g.c.name == group))).one()
        return codec.group_row(fresh), True

    registered, created = await tx.run(st, register)
    if created and not new:
        start_us = None if registered.start is None else v.to_us(registered.start)

        async def fill(conn: AsyncConnection) -> None:
            await st._lock_for_backfill(conn)
            await conn.execute(q.backfill(queue, group, start_us))
            parts = await conn.execute(
                select(d.c.partition)
                .where(
                    d.c.grp == group,
                    d.c.queue == queue,
                    d.c.partition.is_not(None),
                    d.c.status.in_(q.ACTIVE),
                )
                .distinct()
            )
            await streams.refresh(st, conn, [(queue, group, p) for p in parts.scalars()])

        await tx.run(st, fill)
    st._known_groups.add((queue, group))
    return registered


async def unsubscribe_tx(conn: AsyncConnection, queue: str, group: str) -> bool:
    """Deactivate the group and delete its delivery state; whether it was active."""
    result = await conn.execute(
        update(g)
        .where(g.c.queue == queue, g.c.name == group, g.c.active.is_(True))
        .values(active=False)
    )
    for stmt in q.delete_group(queue, group):
        await conn.execute(stmt)
    return bool(result.rowcount)


async def list_tx(conn: AsyncConnection, queue: str | None) -> list[ConsumerGroup]:
    """Registered groups (active and not), of one queue or all."""
    stmt = select(g).order_by(g.c.queue, g.c.name)
    if queue is not None:
        stmt = stmt.where(g.c.queue == queue)
    return [codec.group_row(row) for row in await conn.execute(stmt)]
