"""Consumer groups (bus mode): registering a group, backfilling its delivery rows
from the retained history, and dropping its state when it unsubscribes; and the
check that a claim's group exists.

A group exists only once something asked for it: :meth:`subscribe`, or a claim
(or a worker) given ``subscribe=`` — never a claim by itself. A group name with a
typo in it would otherwise register a new group that starts from the whole
retained history and runs every old task again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select, update

from conveyor import _values as v
from conveyor.errors import ConveyorError, InvalidArgument, NotFound
from conveyor.models import ConsumerGroup, Task
from conveyor.schema import deliveries as d
from conveyor.schema import group_claims as gc
from conveyor.schema import groups as g
from conveyor.schema import tasks as t
from conveyor.store.protocol import codec, pauses, streams, texts
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

BACKFILL_CHUNK = 20_000  # tasks per backfill statement (all in one transaction)
NAMES_SHOWN = 10  # groups of the queue named in the error for a missing one
#: Seconds between two writes of a (queue, group)'s claim time by one store: what
#: last_claim_at is precise to.
NOTE_EVERY = 1.0

log = logging.getLogger("conveyor.store")


def parse_start(field: str, start: Any) -> tuple[bool, int | None]:
    """``start`` of a subscription (``"all"``, ``"new"`` or an aware datetime) as
    ``(new, start_at)``: from now, or from ``start_at`` microseconds (``None``: the
    retained history). ``field`` names the argument in the error."""
    if isinstance(start, datetime):
        return False, v.to_us(v.aware(field, start))
    if isinstance(start, str) and start in ("all", "new"):
        return start == "new", None
    raise InvalidArgument(
        field,
        f'must be "all" (the retained history too), "new" (tasks submitted from now '
        f"on) or an aware datetime, got {start!r}",
    )


async def join(st: Seam, queue: str, group: str, start: Any) -> ConsumerGroup:
    """The claim's check of its group: ``group`` must be subscribed to ``queue``;
    with ``start`` (a subscription start, see :func:`parse_start`), a group never
    registered is subscribed from there first. Raises :class:`NotFound` saying how
    to subscribe when the group is missing, or was unsubscribed (only
    :meth:`subscribe` starts an unsubscribed group over)."""
    if start is not None:
        new, start_at = parse_start("subscribe", start)
        found: ConsumerGroup | None = await subscribe(
            st, queue, group, new=new, start_at=start_at, if_missing=True
        )
    else:

        async def look(conn: AsyncConnection) -> ConsumerGroup | None:
            stmt = select(g).where(g.c.queue == queue, g.c.name == group)
            row = (await conn.execute(stmt)).first()
            return None if row is None else codec.group_row(row)

        found = await tx.run(st, look, write=False)
    if found is not None and found.active:
        st._known_groups.add((queue, group))
        return found
    st._known_groups.discard((queue, group))
    what = f"group {group!r} on queue {queue!r}"
    if found is not None:
        raise NotFound(
            what,
            hint=f"it was unsubscribed; subscribe({queue!r}, {group!r}, start=...) "
            "starts it over (a claim or a worker never does)",
        )
    others = [x.name for x in await tx.run(st, lambda conn: list_tx(conn, queue), write=False)]
    others = [name for name in others if name != group]
    known = (
        f"groups of {queue!r}: "
        + ", ".join(repr(n) for n in others[:NAMES_SHOWN])
        + (", ..." if len(others) > NAMES_SHOWN else "")
        if others
        else f"queue {queue!r} has no groups"
    )
    raise NotFound(
        what,
        hint=f"{known}. A claim does not create a group: check the name, or subscribe "
        f'it first with subscribe({queue!r}, {group!r}, start="new") (tasks submitted '
        'from then on; start="all" replays the retained history too), or pass '
        'subscribe="new" or "all" to the claim or the worker',
    )


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
            # Started over: no claim yet, even if a claim's note of its earlier life
            # landed after the unsubscribe deleted it (the row a note locks alone).
            await conn.execute(delete(gc).where(gc.c.queue == queue, gc.c.grp == group))
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
    """Registered groups (active and not), of one queue or all, each ``paused``
    where it or its whole queue is."""
    stmt = select(g).order_by(g.c.queue, g.c.name)
    if queue is not None:
        stmt = stmt.where(g.c.queue == queue)
    found = [codec.group_row(row) for row in await conn.execute(stmt)]
    held = await pauses.paused_tx(conn, None if queue is None else [queue])
    return [
        replace(x, paused=True) if pauses.is_paused(held, x.queue, x.name) else x for x in found
    ]


async def note_claims(st: Seam, grp: str, claimed: Sequence[Task]) -> None:
    """Record that ``grp`` leased ``claimed`` (``groups()``' ``last_claim_at``):
    one short statement of its own after the claim committed, for the queues whose
    time this store last wrote a second or more ago (by its clock, so a test's
    ``clock_offset`` moves it too; a clock that went back writes again). Queue
    mode records nothing.

    Never inside the claim: that would lock a row every claim of the group
    meets, and the claim stays one statement. A failure here is logged and
    forgotten (the next claim writes again): the claim's tasks are leased already
    and must reach the caller."""
    if not grp or not claimed:
        return
    now = v.now_us() / v.US + st.clock_offset
    noted = st._claims_noted
    due = sorted(
        {
            task.queue
            for task in claimed
            if not 0 <= now - noted.get((task.queue, grp), -NOTE_EVERY) < NOTE_EVERY
        }
    )
    if not due:
        return
    before = {queue: noted.get((queue, grp)) for queue in due}
    for queue in due:  # set first: claims running meanwhile skip the write
        noted[(queue, grp)] = now
    try:
        text = (await texts.of(st))["note_group_claims"]
        await texts.alone(st, text, {"queues": due, "grp": grp}, inline=True)
    except ConveyorError as exc:
        log.warning("could not record the claim time of group %r on %s: %s", grp, due, exc)
        for queue, at in before.items():
            if at is None:
                noted.pop((queue, grp), None)
            else:
                noted[(queue, grp)] = at
