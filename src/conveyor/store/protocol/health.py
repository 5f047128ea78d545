"""Consumer-group health: what :meth:`TaskStore.groups` reports beside each group's
registration — its lag, the age of its oldest claimable task, its last claim and
the state those make (``"ok"``, ``"lagging"``, ``"stalled"``).

Cheap with a large backlog, on every backend:

* the lag is the counts ``stats()`` reads (:func:`.stats.group_counts`, the same
  statement), so the two never disagree;
* the oldest claimable task is found per group by index probes, never by reading
  its backlog. Unpartitioned: the ready index (``ix_conveyor_deliveries_ready``:
  group, queue, priority descending, run_at) holds each priority's tasks in run_at
  order, so the oldest due task of a priority is that priority's first entry;
  a recursive statement steps from one priority to the next lower one (one probe
  each: a skip scan, as few steps as the group has distinct priorities) and takes
  each one's first entry (one probe each). Partitioned: the stream rows hold
  when each head became claimable (``available_at``), read the same way through
  ``ix_conveyor_streams_available``. ``tests/backends/test_pg_plans.py`` holds
  Postgres to it;
* the last claim is one row per (queue, group) in ``conveyor_group_claims``,
  written after claims (:func:`.groups.note_claims`).

The threshold of both states is ``lagging_after`` seconds, by default ten times
the queue's lease (its setting, else the default lease): the oldest claimable
task has waited longer than that. The group is ``"stalled"`` if no claim of it
leased anything for that long too (or ever, since it subscribed), else
``"lagging"``: it claims, but not fast enough. A group with no claimable work is
``"ok"`` however long ago it claimed (an idle group is not a stalled one), and so
is an unsubscribed group (its state was dropped: it has no work).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, func, select

from conveyor import _values as v
from conveyor.models import ConsumerGroup, GroupState
from conveyor.schema import deliveries as d
from conveyor.schema import group_claims as gc
from conveyor.schema import queues as qs
from conveyor.schema import streams as s
from conveyor.store.protocol import groups, stats
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: The default threshold of "lagging" and "stalled", in leases of the queue.
LEASES = 10


def state(oldest_age: float | None, since_claim: float | None, threshold: float) -> GroupState:
    """The state of a group whose oldest claimable task became so ``oldest_age``
    seconds ago (``None``: none is claimable) and whose last claim was
    ``since_claim`` seconds ago (``None``: never), for ``threshold`` seconds."""
    if oldest_age is None or oldest_age <= threshold:
        return "ok"
    if since_claim is None or since_claim > threshold:
        return "stalled"
    return "lagging"


def _first_due(table: Table, keys: list[Any], priority: Any, at: Any, now: int) -> Any:
    """The earliest ``at`` at or before ``now`` among ``table``'s rows meeting
    ``keys``, read from an index on (``keys``' columns, ``priority`` descending,
    ``at``): a skip scan over the priorities, then each one's first entry. One
    scalar, NULL when no row is due."""
    top = select(priority).where(*keys).order_by(priority.desc()).limit(1)
    pr = select(top.scalar_subquery().label("p")).cte("pr", recursive=True)
    lower = (
        select(priority)
        .where(*keys, priority < pr.c.p)
        .order_by(priority.desc())
        .limit(1)
        .scalar_subquery()
    )
    pr = pr.union_all(select(lower.label("p")).where(pr.c.p.is_not(None)))
    first = select(at).where(*keys, priority == pr.c.p).order_by(at).limit(1).scalar_subquery()
    firsts = select(first.label("at")).where(pr.c.p.is_not(None)).subquery()
    return select(func.min(firsts.c.at)).where(firsts.c.at <= now)


def oldest_statements(queue: str, grp: str, now: int) -> tuple[Any, Any]:
    """The earliest run_at of the group's due unpartitioned tasks, and the earliest
    moment one of its partitioned streams' heads became claimable (both in µs,
    NULL for none)."""
    ready = [
        d.c.grp == grp,
        d.c.queue == queue,
        q.is_status(q.QUEUED),
        d.c.partition.is_(None),
    ]
    free = [s.c.grp == grp, s.c.queue == queue, s.c.available_at.is_not(None)]
    return (
        _first_due(d, ready, d.c.priority, d.c.run_at, now),
        _first_due(s, free, s.c.priority, s.c.available_at, now),
    )


async def groups_tx(
    st: Seam, conn: AsyncConnection, queue: str | None, lagging_after: float | None
) -> list[ConsumerGroup]:
    """The registered groups (of one queue or all) with their health."""
    now = await tx.now_us(st, conn)
    found = await groups.list_tx(conn, queue)
    active = [x for x in found if x.active]
    if not active:
        return found
    counts = await stats.group_counts(conn, queue, now)
    claims_q = select(gc.c.queue, gc.c.grp, gc.c.claimed_at)
    leases_q = select(qs.c.queue, qs.c.lease)
    if queue is not None:
        claims_q = claims_q.where(gc.c.queue == queue)
        leases_q = leases_q.where(qs.c.queue == queue)
    claimed = {(r.queue, r.grp): int(r.claimed_at) for r in await conn.execute(claims_q)}
    leases = {r.queue: r.lease for r in await conn.execute(leases_q)}
    out: list[ConsumerGroup] = []
    for group in found:
        if not group.active:
            out.append(group)
            continue
        key = (group.queue, group.name)
        plain, streamed = oldest_statements(group.queue, group.name, now)
        first = (await conn.execute(plain)).scalar()
        if first is not None:
            # A task older than the group became claimable for it when it subscribed.
            first = max(int(first), v.to_us(group.created_at))
        head = (await conn.execute(streamed)).scalar()
        since = [int(x) for x in (first, head) if x is not None]
        oldest_age = (now - min(since)) / v.US if since else None
        at = claimed.get(key)
        since_claim = None if at is None else (now - at) / v.US
        threshold = (
            lagging_after
            if lagging_after is not None
            else LEASES * float(leases.get(group.queue) or q.DEFAULT_LEASE)
        )
        out.append(
            replace(
                group,
                lag=stats.lag(counts[key]) if key in counts else 0,
                oldest_age=oldest_age,
                last_claim_at=None if at is None else v.from_us(at),
                state=state(oldest_age, since_claim, threshold),
            )
        )
    return out
