"""Consumer groups (bus mode): registering a group, backfilling its delivery rows
from the retained history, and dropping its state when it unsubscribes.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.models import ConsumerGroup
from conveyor.schema import deliveries as d
from conveyor.schema import groups as g
from conveyor.schema import tasks as t
from conveyor.store.protocol import codec, streams
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

BACKFILL_CHUNK = 20_000  # tasks per backfill statement (all in one transaction)


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
    microseconds) or from the retained history (neither), and backfill its delivery
    rows — all in one transaction: the producer barrier, then the group row, then
    the backfill. A failure anywhere (a lock or statement timeout) leaves nothing
    behind, so no consumer ever sees a registered group without its history, and a
    retry starts clean."""

    async def register(conn: AsyncConnection) -> ConsumerGroup:
        found = select(g).where(g.c.queue == queue, g.c.name == group)
        row = (await conn.execute(found)).first()
        if row is not None and (row.active or if_missing):
            # An unsubscribed group stays so until subscribe() is called: a stray
            # worker's claim must not bring it back and replay the history.
            return codec.group_row(row)
        # Wait out producers in flight and hold new ones back until commit; the
        # barrier also queues concurrent subscribes, so look again behind it.
        await st._lock_for_backfill(conn)
        now = await tx.now_us(st, conn)
        begin = now if new else start_at
        # Idempotent: many workers registering one group at once all succeed.
        inserted = (
            await conn.execute(
                st._upsert(g)
                .values(queue=queue, name=group, start_at=begin, created_at=now, active=True)
                .on_conflict_do_nothing(index_elements=["queue", "name"])
                .returning(g.c.name)
            )
        ).first()
        if inserted is None:
            row = (await conn.execute(st._lock_rows(found))).one()
            if row.active or if_missing:
                return codec.group_row(row)  # registered meanwhile by someone else
            await conn.execute(
                update(g)
                .where(g.c.queue == queue, g.c.name == group)
                .values(start_at=begin, created_at=now, active=True)
            )
        if not new:
            await backfill(st, conn, queue, group, begin)
        return codec.group_row((await conn.execute(found)).one())

    registered = await tx.run(st, register)
    st._known_groups.add((queue, group))
    return registered


async def backfill(
    st: Seam, conn: AsyncConnection, queue: str, group: str, start_us: int | None
) -> None:
    """The new group's delivery rows for the retained history from ``start_us``, in
    chunks of BACKFILL_CHUNK tasks (no one statement outgrows ``statement_timeout``),
    inside the subscribe's transaction; then its streams."""
    after = 0
    while True:
        upto = (
            await conn.execute(
                select(t.c.seq)
                .where(t.c.queue == queue, t.c.seq > after)
                .order_by(t.c.seq)
                .offset(BACKFILL_CHUNK - 1)
                .limit(1)
            )
        ).scalar()
        await conn.execute(q.backfill(queue, group, start_us, after, upto))
        if upto is None:
            break
        after = upto
    parts = await conn.execute(
        select(d.c.partition)
        .where(
            d.c.grp == group,
            d.c.queue == queue,
            d.c.partition.is_not(None),
            q.active(),
        )
        .distinct()
    )
    await streams.refresh(st, conn, [(queue, group, p) for p in parts.scalars()])


async def unsubscribe_tx(st: Seam, conn: AsyncConnection, queue: str, group: str) -> bool:
    """Deactivate the group and delete its state; whether it was active.

    The group row is locked first: producers in flight share it (see
    :func:`conveyor.store.protocol.producer.insert_tasks`), so this waits for them and
    later producers see the group inactive — no delivery row is ever left behind
    for it. Then its stream rows, then its delivery rows (the lock order)."""
    await conn.execute(
        st._lock_rows(select(g.c.active).where(g.c.queue == queue, g.c.name == group))
    )
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
