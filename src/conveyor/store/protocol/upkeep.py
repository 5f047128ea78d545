"""Upkeep: lease recovery, eviction (``max_wait``), retention, the rolled-up counts
behind stats(), and the maintenance pass that runs them.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select, tuple_, update

from conveyor import _values as v
from conveyor.errors import InvalidArgument
from conveyor.models import Backoff, Rate
from conveyor.schema import batches as bt
from conveyor.schema import counts as cn
from conveyor.schema import deliveries as d
from conveyor.schema import dependencies as dep
from conveyor.schema import groups as g
from conveyor.schema import keys as k
from conveyor.schema import maintenance as mt
from conveyor.schema import queues as qs
from conveyor.schema import tasks as t
from conveyor.store.protocol import dead_letters, limits, observed, pauses, streams, wake
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

PURGE_BATCH = 1_000
IDLE_STREAM_BATCH = 1_000
ROLLUP_BATCH = 5_000
#: How long past its time a row of ``conveyor_rate_state`` is kept (seconds). A
#: rate's row whose time has passed limits nothing (a full burst is allowed again,
#: as with no row at all); a fair queue's turn that old only orders keys served
#: that long ago among themselves, and forgetting it puts them first, which is fair.
RATE_STATE_KEEP = 3600.0
TERMINAL = ("succeeded", "failed", "cancelled", "evicted", "skipped")
LEASE_EXPIRED = json.dumps(
    {
        "type": "LeaseExpired",
        "code": "lease_expired",
        "message": "the lease expired on the last attempt",
        "retryable": False,
        "traceback": None,
    }
)


async def recover_tx(
    st: Seam, conn: AsyncConnection, grp: str | None, names: Sequence[str] | None
) -> tuple[int, int]:
    """Expired leases (of ``grp`` in ``names``; ``None``: all): requeued while
    attempts remain, else failed. Returns ``(requeued, failed)``."""
    # The lock order: find the expired rows, lock their streams, then update them
    # (the update re-checks that each is still expired).
    expired = list(
        await conn.execute(
            select(d.c.task_seq, d.c.grp, d.c.queue, d.c.partition).where(
                *q.expired(tx.now(st), grp, names)
            )
        )
    )
    if not expired:
        return 0, 0
    await streams.lock_streams(st, conn, [(r.queue, r.grp, r.partition) for r in expired])
    found = [(r.task_seq, r.grp) for r in expired]
    rows = list(await conn.execute(q.recover_expired(tx.now(st), grp, names, LEASE_EXPIRED, found)))
    requeued = [r for r in rows if r.status == q.QUEUED]
    failed = [r for r in rows if r.status != q.QUEUED]
    touched = [(r.queue, r.grp, r.partition) for r in rows if r.partition is not None]
    await streams.refresh(st, conn, touched)
    if failed:
        await st._notify(conn, {r.queue for r in failed}, done=True)
        # The lease lost on the last attempt: a failure for good.
        await dead_letters.send(st, conn, [(r.task_seq, r.grp) for r in failed])
    if requeued:
        # Recovered by maintain() (or a claimer of other queues): idle workers
        # should hear of the work rather than wait for their next poll.
        await st._notify(conn, {r.queue for r in requeued}, done=False)
    return len(requeued), len(failed)


def queue_settings(
    *,
    lease: v.Duration | None,
    max_attempts: int | None,
    backoff: Backoff | dict[str, float] | v.Duration | None,
    retention: v.Duration | None,
    max_wait: v.Duration | None,
    queue_mode: bool | None,
    dead_letter: str | None = None,
    queue: str | None = None,
    delay: v.Duration | None = None,
    max_depth: int | None = None,
    debounce: v.Duration | None = None,
    encrypt: bool | None = None,
    concurrency: int | None = None,
    key_concurrency: int | None = None,
    rate: Rate | int | None = None,
    key_rate: Rate | int | None = None,
    fair: bool | None = None,
) -> dict[str, Any]:
    """Validate configure_queue()'s arguments: the column values to store."""
    values: dict[str, Any] = {}
    for field, limit in (("concurrency", concurrency), ("key_concurrency", key_concurrency)):
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 2**31:
                raise InvalidArgument(
                    field, f"must be a whole number >= 0 (0: no limit), got {limit!r}"
                )
            values[field] = limit or None
    for field, given in (("rate", rate), ("key_rate", key_rate)):
        if given is None:
            continue
        if isinstance(given, Rate):
            values[f"{field}_limit"], values[f"{field}_per"] = given.limit, given.per
        elif given == 0 and not isinstance(given, bool) and isinstance(given, int):
            values[f"{field}_limit"] = values[f"{field}_per"] = None
        else:
            raise InvalidArgument(
                field, f"must be a conveyor.Rate, or 0 to clear it, got {given!r}"
            )
    if fair is not None:
        if not isinstance(fair, bool):
            raise InvalidArgument("fair", f"must be True or False, got {fair!r}")
        values["fair"] = fair or None
    if encrypt is not None:
        if not isinstance(encrypt, bool):
            raise InvalidArgument("encrypt", f"must be True or False, got {encrypt!r}")
        values["encrypt"] = encrypt
    if debounce is not None:
        values["debounce"] = v.duration_seconds("debounce", debounce) or None
    if max_depth is not None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
            raise InvalidArgument(
                "max_depth", f"must be a whole number >= 0 (0: no limit), got {max_depth!r}"
            )
        values["max_depth"] = max_depth or None
    if delay is not None:
        values["delay"] = v.duration_seconds("delay", delay)
    if dead_letter is not None:
        # "" clears the setting; a queue cannot be its own dead-letter queue (a task
        # failing there would be sent on forever).
        values["dead_letter"] = v.name("dead_letter", dead_letter) if dead_letter else None
        if queue is not None and values["dead_letter"] == queue:
            raise InvalidArgument("dead_letter", f"must name another queue than {queue!r} itself")
    if lease is not None:
        values["lease"] = v.duration_seconds("lease", lease, allow_zero=False)
    if max_attempts is not None:
        values["max_attempts"] = v.positive_int("max_attempts", max_attempts)
    if backoff is not None:
        b = v.backoff("backoff", backoff)
        assert b is not None
        values["backoff"] = json.dumps(b.as_dict())
    if retention is not None:
        values["retention"] = v.duration_seconds("retention", retention)
    if max_wait is not None:
        values["max_wait"] = v.duration_seconds("max_wait", max_wait, allow_zero=False)
    if queue_mode is not None:
        if not isinstance(queue_mode, bool):
            raise InvalidArgument("queue_mode", f"must be True or False, got {queue_mode!r}")
        values["queue_mode"] = queue_mode
    return values


async def get_queue_tx(conn: AsyncConnection, queue: str) -> dict[str, Any]:
    """The stored settings of ``queue`` (``None`` where the default applies)."""
    row = (await conn.execute(select(qs).where(qs.c.queue == queue))).first()
    held = await pauses.paused_tx(conn, [queue])
    return settings_dict(queue, row, (queue, pauses.WHOLE_QUEUE) in held)


async def all_settings_tx(conn: AsyncConnection) -> list[dict[str, Any]]:
    """The stored settings of every configured queue, by name."""
    rows = list(await conn.execute(select(qs).order_by(qs.c.queue)))
    held = await pauses.paused_tx(conn)
    return [settings_dict(row.queue, row, (row.queue, pauses.WHOLE_QUEUE) in held) for row in rows]


def settings_dict(queue: str, row: Any, paused: bool) -> dict[str, Any]:
    """A queue's settings row (or ``None``: none stored) as ``get_queue`` shows it,
    with whether the queue is paused (not a setting but its state, set by pause()
    and resume())."""
    out: dict[str, Any] = {
        "queue": queue,
        "lease": None,
        "max_attempts": None,
        "backoff": None,
        "retention": None,
        "max_wait": None,
        "queue_mode": True,
        "dead_letter": None,
        "delay": None,
        "max_depth": None,
        "debounce": None,
        "encrypt": False,
        "concurrency": None,
        "key_concurrency": None,
        "rate": None,
        "key_rate": None,
        "fair": False,
    }
    if row is not None:
        out.update(
            lease=row.lease,
            max_attempts=row.max_attempts,
            backoff=None if row.backoff is None else json.loads(row.backoff),
            retention=row.retention,
            max_wait=row.max_wait,
            queue_mode=row.queue_mode is not False,
            dead_letter=row.dead_letter,
            delay=row.delay,
            max_depth=row.max_depth,
            debounce=row.debounce,
            encrypt=bool(row.encrypt),
            concurrency=row.concurrency,
            key_concurrency=row.key_concurrency,
            rate=None if row.rate_limit is None else Rate(row.rate_limit, row.rate_per),
            key_rate=(
                None if row.key_rate_limit is None else Rate(row.key_rate_limit, row.key_rate_per)
            ),
            fair=bool(row.fair),
        )
    out["paused"] = paused
    return out


async def history_tx(conn: AsyncConnection, limit: int) -> list[dict[str, Any]]:
    """The most recent maintenance passes, newest first."""
    rows = await conn.execute(select(mt).order_by(mt.c.id.desc()).limit(limit))
    return [
        {
            "ran_at": v.from_us(int(r.ran_at)),
            "recovered": r.recovered,
            "expired": r.expired,
            "evicted": r.evicted,
            "deleted": r.deleted,
            "duration": r.duration,
        }
        for r in rows
    ]


async def configure_tx(st: Seam, conn: AsyncConnection, queue: str, values: dict[str, Any]) -> None:
    """Store the given settings of ``queue`` (others keep their value)."""
    now = await tx.now_us(st, conn)
    ins = st._upsert(qs).values(queue=queue, updated_at=now, **values)
    await conn.execute(
        ins.on_conflict_do_update(index_elements=["queue"], set_={"updated_at": now, **values})
    )
    stored = (await conn.execute(select(qs).where(qs.c.queue == queue))).one()
    if stored.max_depth is not None and stored.queue_mode is False:
        # max_depth counts queue mode's queued tasks, which on a queue consumed by
        # groups only nobody claims: it would fill and refuse every submit for good.
        # (Raised inside the transaction: neither setting is stored.)
        raise InvalidArgument(
            "max_depth",
            f"queue {queue!r} is consumed by groups only (queue_mode=False), whose queue-"
            "mode tasks are never claimed: a max_depth would refuse every submit once "
            "reached; set one on a queue that queue mode consumes",
        )


async def maintain(st: Seam, *, housekeeping: bool = True) -> dict[str, int]:
    """One maintenance pass (see :meth:`conveyor.store.base.TaskStore.maintain`).

    Without ``housekeeping`` (a worker's pass at its start) the pass recovers
    expired leases, evicts what waited past ``max_wait`` and refreshes the table
    statistics, and leaves retention, the roll-up of finished rows into the counts
    and idle streams to the next full pass. Those are bookkeeping that can wait,
    and at a start beside a backlog they ran inside the drain: rolling up 15,000
    rows cost the server 0.34 s while a worker drained 20,000 tasks.

    The pass's history row is written first and each step adds its counts to it
    in the step's own transaction, so the history stays exact even when a pass
    is cut short (a stopping worker cancels it, the database goes away midway):
    what a committed step did is counted, and nothing else is.
    """
    started = time.monotonic()
    async with st._maintenance_lock() as mine:
        if not mine:
            return {"recovered": 0, "expired": 0, "evicted": 0, "deleted": 0, "skipped": 1}
        pass_id = await tx.run(st, functools.partial(begin_pass, st))

        async def recover(conn: AsyncConnection) -> tuple[int, int]:
            requeued, failed = await recover_tx(st, conn, None, None)
            await count_pass(conn, pass_id, recovered=requeued, expired=failed)
            return requeued, failed

        async def evict(queue: str, max_wait: float, conn: AsyncConnection) -> int:
            evicted = await evict_tx(st, conn, queue, max_wait)
            await count_pass(conn, pass_id, evicted=evicted)
            return evicted

        requeued, failed = await tx.run(st, recover)
        settings = await tx.run(st, all_settings, write=False)
        evicted = 0
        deleted = 0
        for row in settings:
            if row.max_wait is not None:
                evicted += await tx.run(st, functools.partial(evict, row.queue, row.max_wait))
            if housekeeping and row.retention is not None:
                deleted += await purge(st, row.queue, row.retention, row.queue_mode, pass_id)
        if housekeeping:
            await rollup(st)
            await drop_idle_streams(st)
            await tx.run(st, functools.partial(limits.prune_tx, st, keep_s=RATE_STATE_KEEP))
        # Not a write of the protocol's: on SQLite (nothing to refresh) it must not
        # take the write lock; Postgres's ANALYZE runs in any transaction.
        await tx.run(st, st._refresh_statistics, write=False)
        counts = {
            "recovered": requeued,
            "expired": failed,
            "evicted": evicted,
            "deleted": deleted,
        }

        async def finish(conn: AsyncConnection) -> None:
            await conn.execute(
                update(mt).where(mt.c.id == pass_id).values(duration=time.monotonic() - started)
            )

        await tx.run(st, finish)
    if evicted or failed:
        wake.wake_local(st, work=False)
    return {**counts, "skipped": 0}


async def begin_pass(st: Seam, conn: AsyncConnection) -> int:
    """Open a pass's history row (all counts 0); its id."""
    now = await tx.now_us(st, conn)
    row = await conn.execute(
        mt.insert()
        .values(ran_at=now, duration=0.0, recovered=0, expired=0, evicted=0, deleted=0)
        .returning(mt.c.id)
    )
    return int(row.scalar_one())


async def count_pass(conn: AsyncConnection, pass_id: int | None, **counts: int) -> None:
    """Add a step's counts to its pass's history row, in the step's transaction."""
    added = {field: mt.c[field] + n for field, n in counts.items() if n}
    if pass_id is not None and added:
        await conn.execute(update(mt).where(mt.c.id == pass_id).values(added))


async def all_settings(conn: AsyncConnection) -> list[Any]:
    """The settings rows of queues with eviction or retention configured."""
    rows = await conn.execute(
        select(qs).where((qs.c.max_wait.is_not(None)) | (qs.c.retention.is_not(None)))
    )
    return list(rows)


async def evict_tx(st: Seam, conn: AsyncConnection, queue: str, max_wait: float) -> int:
    """Tasks never claimed ``max_wait`` after they became deliverable become
    ``evicted``: for queue mode counted from their run_at, for a group from
    max(run_at, the group's subscription) — a replay starts waiting when the group
    subscribes, not when its tasks were first due."""
    now_us = await tx.now_us(st, conn)
    cutoff = now_us - round(max_wait * v.US)
    groups = await conn.execute(
        select(g.c.name, g.c.created_at).where(g.c.queue == queue, g.c.active.is_(True))
    )
    # A group subscribed less than max_wait ago has nothing to evict yet.
    grps = [q.QUEUE_MODE, *(name for name, since in groups if since < cutoff)]
    evicted = 0
    touched: list[tuple[Any, ...]] = []
    gone: list[tuple[int, str]] = []
    for grp in grps:
        due = (
            d.c.grp == grp,
            d.c.queue == queue,
            q.is_status(q.QUEUED),
            d.c.attempt == 0,
            d.c.run_at < cutoff,
        )
        # The lock order: the streams first.
        keys = await conn.execute(
            select(d.c.queue, d.c.grp, d.c.partition)
            .where(*due, d.c.partition.is_not(None))
            .distinct()
        )
        await streams.lock_streams(st, conn, [tuple(key) for key in keys])
        rows = list(
            await conn.execute(
                update(d)
                .where(*due)
                .values(status="evicted", finished_at=now_us)
                .returning(d.c.queue, d.c.grp, d.c.partition, d.c.task_seq)
            )
        )
        evicted += len(rows)
        touched += [(r.queue, r.grp, r.partition) for r in rows if r.partition is not None]
        gone += [(r.task_seq, r.grp) for r in rows]
    await streams.refresh(st, conn, touched)
    await dead_letters.send(st, conn, gone)
    if evicted:
        await st._notify(conn, {queue}, done=True)
    return evicted


async def drop_idle_streams(st: Seam) -> int:
    """Delete the stream rows with nothing active (a partition name used once, a
    stream run dry), so ``conveyor_streams`` does not grow with every partition
    ever named. The next task of such a stream creates its row again."""
    total = 0
    while True:
        dropped, more = await tx.run(st, functools.partial(drop_idle_streams_batch, st))
        total += dropped
        if not more:
            return total


async def drop_idle_streams_batch(st: Seam, conn: AsyncConnection) -> tuple[int, bool]:
    """One bounded batch of :func:`drop_idle_streams`: ``(dropped, more to look at)``."""
    # Lock the rows without a head (skipping any a transaction holds: it is using
    # them), then check in a fresh read that no active row appeared in them.
    idle = [
        tuple(row)
        for row in await conn.execute(st._lock_candidates(q.idle_streams(IDLE_STREAM_BATCH)))
    ]
    if not idle:
        return 0, False
    busy = {tuple(row) for row in await conn.execute(q.busy_streams(idle))}
    empty = [key for key in idle if key not in busy]
    if empty:
        await conn.execute(q.delete_streams(empty))
    return len(empty), len(idle) == IDLE_STREAM_BATCH and bool(empty)


async def purge(
    st: Seam,
    queue: str,
    retention: float,
    queue_mode: bool | None,
    pass_id: int | None = None,
) -> int:
    """Delete tasks finished for everyone more than ``retention`` seconds ago.

    Walks candidates in (finished_at, task) order with a moving cursor, one
    bounded batch per transaction, so a large purge never holds long locks and
    a task kept back (a slow group) is looked at once per pass.
    """
    cursor: tuple[int, int] = (-1, -1)
    deleted = 0
    while True:
        batch, cursor = await tx.run(
            st,
            functools.partial(
                purge_batch,
                st,
                queue=queue,
                retention=retention,
                queue_mode=queue_mode,
                cursor=cursor,
                pass_id=pass_id,
            ),
        )
        if batch < 0:
            return deleted
        deleted += batch


async def purge_batch(
    st: Seam,
    conn: AsyncConnection,
    queue: str,
    retention: float,
    queue_mode: bool | None,
    cursor: tuple[int, int],
    pass_id: int | None = None,
) -> tuple[int, tuple[int, int]]:
    """One bounded batch of :func:`purge`: ``(deleted, next cursor)``, ``-1`` when done."""
    now_us = await tx.now_us(st, conn)
    cutoff = now_us - round(retention * v.US)
    # Which delivery rows must be finished: queue mode's unless the queue is
    # declared group-only, and every active group's. Rows of an unsubscribed group
    # never hold a task back, so nothing is kept forever.
    active = select(g.c.name).where(g.c.queue == queue, g.c.active.is_(True))
    holds = (
        d.c.grp.in_(active)
        if queue_mode is False
        else (d.c.grp == q.QUEUE_MODE) | d.c.grp.in_(active)
    )
    candidates = list(
        await conn.execute(
            select(d.c.finished_at, d.c.task_seq)
            .where(
                d.c.queue == queue,
                d.c.finished_at.is_not(None),
                d.c.finished_at < cutoff,
                tuple_(d.c.finished_at, d.c.task_seq) > tuple_(*cursor),
                holds,
            )
            .order_by(d.c.finished_at, d.c.task_seq)
            .limit(PURGE_BATCH)
        )
    )
    if not candidates:
        return -1, cursor
    seqs = sorted({row.task_seq for row in candidates})
    pending = d.alias("pending")
    blocked = set(
        (
            await conn.execute(
                select(pending.c.task_seq).where(
                    pending.c.task_seq.in_(seqs),
                    pending.c.grp.in_(active)
                    if queue_mode is False
                    else (pending.c.grp == q.QUEUE_MODE) | pending.c.grp.in_(active),
                    (pending.c.finished_at.is_(None)) | (pending.c.finished_at >= cutoff),
                )
            )
        ).scalars()
    )
    doomed = [seq for seq in seqs if seq not in blocked]
    if doomed:
        await delete_tasks(st, conn, doomed)
        await count_pass(conn, pass_id, deleted=len(doomed))
    last = candidates[-1]
    return len(doomed), (last.finished_at, last.task_seq)


async def delete_tasks(st: Seam, conn: AsyncConnection, doomed: Sequence[int]) -> None:
    """Delete the finished tasks ``doomed`` (sequence numbers), their keys and
    delivery rows, taking rolled-up rows out of the counts."""
    rolled = await conn.execute(
        select(d.c.queue, d.c.grp, d.c.status, func.count())
        .where(d.c.task_seq.in_(doomed), d.c.rolled == 1)
        .group_by(d.c.queue, d.c.grp, d.c.status)
    )
    await add_counts(st, conn, {(qn, gr, s): -n for qn, gr, s, n in rolled})
    # Finished rows not rolled up yet still count as finished (throughput, totals).
    unrolled = await conn.execute(
        select(d.c.task_seq, d.c.queue, d.c.grp, d.c.status, d.c.finished_at).where(
            d.c.task_seq.in_(doomed), *q.unrolled(), d.c.status.in_(TERMINAL)
        )
    )
    await observed.fold_observed(st, conn, [tuple(r) for r in unrolled])
    ids = select(t.c.id).where(t.c.seq.in_(doomed))
    await conn.execute(delete(k).where(k.c.task_id.in_(ids)))
    # No foreign key deletes delivery rows with their task (schema.py says why):
    # this transaction deletes both, the tasks first. Deleting tasks waits for a
    # subscribe in flight (its table lock on conveyor_tasks), so the delete of
    # delivery rows after it also removes the rows that backfill just wrote for
    # these tasks: no delivery row outlives its task.
    await conn.execute(delete(t).where(t.c.seq.in_(doomed)))
    await conn.execute(delete(d).where(d.c.task_seq.in_(doomed)))
    # Their dependency edges (both ends: an edge of a finished parent is resolved)
    # and the batches they are the callbacks of.
    await conn.execute(delete(dep).where(dep.c.task_seq.in_(doomed)))
    await conn.execute(delete(dep).where(dep.c.parent_seq.in_(doomed)))
    await conn.execute(delete(bt).where(bt.c.callback_seq.in_(doomed)))


async def add_counts(
    st: Seam, conn: AsyncConnection, deltas: Mapping[tuple[str, str, str], int]
) -> None:
    """Add to the rolled-up finished counts of (queue, group, status)."""
    for (queue, grp, status), n in sorted(deltas.items()):
        if n:
            ins = st._upsert(cn).values(queue=queue, grp=grp, status=status, n=n)
            await conn.execute(
                ins.on_conflict_do_update(
                    index_elements=["queue", "grp", "status"], set_={"n": cn.c.n + n}
                )
            )


async def rollup(st: Seam) -> int:
    """Fold finished rows into ``conveyor_counts`` in bounded batches, so stats()
    reads totals plus the few rows finished since, whatever the history."""
    total = 0
    await tx.run(st, lambda conn: observed.prune_observed(st, conn))
    while True:
        rolled = await tx.run(st, lambda conn: rollup_batch(st, conn))
        total += rolled
        # A short batch has caught up: what finished since is the next pass's.
        # Folding until a batch came back empty chased a busy queue's completions
        # for as long as they kept coming, and the pass never ended.
        if rolled < ROLLUP_BATCH:
            return total


async def rollup_batch(st: Seam, conn: AsyncConnection) -> int:
    """Fold one bounded batch of finished rows; how many."""
    seqs = list(
        (
            await conn.execute(
                select(d.c.task_seq)
                .where(*q.unrolled(), d.c.status.in_(TERMINAL))
                .limit(ROLLUP_BATCH)
            )
        ).scalars()
    )
    if not seqs:
        return 0
    rows = await conn.execute(
        update(d)
        .where(*q.unrolled(), d.c.status.in_(TERMINAL), d.c.task_seq.in_(sorted(set(seqs))))
        .values(rolled=1)
        .returning(d.c.queue, d.c.grp, d.c.status, d.c.task_seq, d.c.finished_at)
    )
    done = list(rows)
    await observed.fold_observed(
        st, conn, [(r.task_seq, r.queue, r.grp, r.status, r.finished_at) for r in done]
    )
    deltas: dict[tuple[str, str, str], int] = {}
    n = 0
    for row in done:
        key = (row.queue, row.grp, row.status)
        deltas[key] = deltas.get(key, 0) + 1
        n += 1
    await add_counts(st, conn, deltas)
    return n
