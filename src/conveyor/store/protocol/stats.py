"""stats(): per queue and consumer group, counts by status, lag and the age of the
oldest claimable task, read as one consistent snapshot.

The counts come from three places: the totals folded up by ``maintain()``
(``conveyor_counts``), the rows not folded yet (read from their partial index) and
the leased rows (from theirs, which on Postgres is where running rows live). A
claim, an acknowledgement or a roll-up moves a task from one place to another, so
reading them in separate statements counts a task twice or not at all whenever
one commits between the reads: on Postgres, where every statement of a READ
COMMITTED transaction sees what has committed by its start, 300 tasks under
concurrent claims read as 298 to 306. So every part is one branch of a single
``UNION ALL`` statement, which sees one snapshot on every backend (and costs the
same: each branch still reads its own index).

A queue declared consumed by groups only (``configure_queue(queue_mode=False)``)
still has queue-mode rows that nobody claims; its report leaves queue mode out
(empty ``counts``, no oldest age, ``queue_mode=False``) instead of showing a
backlog that never drains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    String,
    cast,
    false,
    func,
    literal_column,
    null,
    select,
    union_all,
)

from conveyor import _values as v
from conveyor.models import GroupStats, QueueStats, Status
from conveyor.schema import counts as cn
from conveyor.schema import deliveries as d
from conveyor.schema import groups as g
from conveyor.schema import pauses as pz
from conveyor.schema import queues as qs
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

# What each branch's rows are: counts by status, an oldest claimable run_at, an
# active group, a queue whose queue mode is off, a pause (grp '': the queue's).
COUNT, OLDEST, GROUP, OFF, PAUSED = "n", "oldest", "group", "off", "paused"


def _kind(name: str) -> Any:
    return literal_column(f"'{name}'", String).label("kind")


def _no_status() -> Any:
    return cast(null(), String).label("status")


def _zero() -> Any:
    return cast(literal_column("0"), BigInteger).label("n")


def snapshot_statement(queue: str | None, now: int, *, oldest_age: bool = True) -> Any:
    """The one statement behind :func:`stats_tx`: rows ``(kind, queue, grp, status, n)``
    (without the oldest claimable ages where ``oldest_age`` is false)."""
    live = (
        select(_kind(COUNT), d.c.queue, d.c.grp, d.c.status, func.count().label("n"))
        .where(*q.unrolled())
        .group_by(d.c.queue, d.c.grp, d.c.status)
    )
    leased = (
        select(_kind(COUNT), d.c.queue, d.c.grp, d.c.status, func.count().label("n"))
        .where(q.is_status(q.RUNNING), d.c.rolled == literal_column("0"))
        .group_by(d.c.queue, d.c.grp, d.c.status)
    )
    rolled = select(_kind(COUNT), cn.c.queue, cn.c.grp, cn.c.status, cn.c.n)
    oldest = (
        select(_kind(OLDEST), d.c.queue, d.c.grp, _no_status(), func.min(d.c.run_at).label("n"))
        .where(*q.unrolled(), *q.claimable(now))
        .group_by(d.c.queue, d.c.grp)
    )
    active = select(_kind(GROUP), g.c.queue, g.c.name, _no_status(), _zero()).where(
        g.c.active.is_(True)
    )
    no_group = literal_column("''", String)
    off = select(_kind(OFF), qs.c.queue, no_group, _no_status(), _zero()).where(
        qs.c.queue_mode.is_(false())
    )
    paused = select(_kind(PAUSED), pz.c.queue, pz.c.grp, _no_status(), _zero())
    if queue is not None:
        paused = paused.where(pz.c.queue == queue)
        live = live.where(d.c.queue == queue)
        leased = leased.where(d.c.queue == queue)
        rolled = rolled.where(cn.c.queue == queue)
        oldest = oldest.where(d.c.queue == queue)
        active = active.where(g.c.queue == queue)
        off = off.where(qs.c.queue == queue)
    if not oldest_age:
        return union_all(live, leased, rolled, active, off, paused)
    return union_all(live, leased, rolled, oldest, active, off, paused)


def _zeros() -> dict[str, int]:
    return {x.value: 0 for x in Status}


def lag(counts: dict[str, int]) -> int:
    """A view's lag from its counts: the tasks not yet terminal for it."""
    return counts["queued"] + counts["running"]


async def group_counts(
    conn: AsyncConnection, queue: str | None, now: int
) -> dict[tuple[str, str], dict[str, int]]:
    """The counts by status of every (queue, group) with rows, queue mode's too, as
    :func:`stats_tx` reads them (the same statement, less the oldest ages)."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for kind, qn, grp, status, n in await conn.execute(
        snapshot_statement(queue, now, oldest_age=False)
    ):
        if kind == COUNT:
            counts.setdefault((qn, grp), _zeros())[status] += int(n)
    return counts


async def stats_tx(st: Seam, conn: AsyncConnection, queue: str | None) -> list[QueueStats]:
    """Per-queue counts, lag and oldest claimable age (see TaskStore.stats)."""
    now = await tx.now_us(st, conn)
    counts: dict[tuple[str, str], dict[str, int]] = {}
    oldest: dict[tuple[str, str], float] = {}
    groups: set[tuple[str, str]] = set()
    queue_mode_off: set[str] = set()
    paused: set[tuple[str, str]] = set()
    for kind, qn, grp, status, n in await conn.execute(snapshot_statement(queue, now)):
        if kind == COUNT:
            counts.setdefault((qn, grp), _zeros())[status] += int(n)
        elif kind == OLDEST:
            oldest[(qn, grp)] = (now - int(n)) / v.US
        elif kind == GROUP:
            groups.add((qn, grp))
        elif kind == PAUSED:
            paused.add((qn, grp))
        else:
            queue_mode_off.add(qn)
    # Queue mode shows up where it has something (or is paused); a group once it
    # is subscribed.
    shown = {key for key, c in counts.items() if any(c.values()) or key[1]} | groups
    shown |= {(qn, q.QUEUE_MODE) for qn, grp in paused if grp == q.QUEUE_MODE}
    out: dict[str, QueueStats] = {}
    for qn, grp in sorted(shown):
        if qn not in out:
            if qn in queue_mode_off:
                out[qn] = QueueStats(
                    queue=qn,
                    counts={},
                    oldest_claimable_age=None,
                    queue_mode=False,
                    paused=(qn, q.QUEUE_MODE) in paused,
                )
            else:
                out[qn] = QueueStats(
                    queue=qn,
                    counts=counts.get((qn, q.QUEUE_MODE), _zeros()),
                    oldest_claimable_age=oldest.get((qn, q.QUEUE_MODE)),
                    paused=(qn, q.QUEUE_MODE) in paused,
                )
        if grp:
            c = counts.get((qn, grp), _zeros())
            out[qn].groups[grp] = GroupStats(
                counts=c,
                lag=lag(c),
                oldest_claimable_age=oldest.get((qn, grp)),
                paused=(qn, grp) in paused or (qn, q.QUEUE_MODE) in paused,
            )
    return list(out.values())
