"""Consumer: claiming (plain work and streams), the fenced writes of a lease holder
(heartbeat, progress, fail, release, snooze), and the explanation of a failed
fence. Acknowledgements (succeed, one or many) are :mod:`conveyor.store.protocol.acks`.

Fencing: every write of a holder names the task, its group, the worker and
optionally the attempt; it changes the row only while the row is running and
leased to that worker (on that attempt). Otherwise nothing is written and the
caller learns why: :class:`NotFound`, :class:`TaskCancelled` or :class:`LostLease`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, select, update

from conveyor import _values as v
from conveyor.encryption import MARK
from conveyor.errors import LostLease, NotFound, TaskCancelled
from conveyor.models import Task
from conveyor.schema import deliveries as d
from conveyor.schema import queues as qs
from conveyor.schema import tasks as t
from conveyor.store.protocol import codec, dead_letters, limits, streams, upkeep
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Claim, Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: How many times a claim recovers expired leases and asks again before it
#: returns empty-handed (leases expiring as fast as they are recovered).
RECOVERIES = 3


async def claim(
    st: Seam,
    grp: str,
    names: Sequence[str],
    worker_id: str,
    lease: float | None,
    limit: int,
    partition: str | None,
    per_stream: int | None = None,
) -> list[Task]:
    """Claim through the dialect's claim hook (:meth:`~conveyor.store.seam.Seam._claim`,
    in the order of :mod:`conveyor.store.protocol.claim_order`): after the probe
    where the dialect has one, and after recovering the expired leases of these
    queues when the hook finds one (it then leased nothing)."""
    # The probe spares idle claimers the write lock; right after a claim that found
    # work, the next one most likely finds work too, so it goes straight in.
    busy_key = (grp, tuple(names), partition)
    if busy_key not in st._busy:
        probe = st._claim_probe(grp, names, partition)
        if probe is not None:

            async def ask(conn: AsyncConnection) -> bool:
                assert probe is not None
                return any((await conn.execute(probe)).one())

            if not await tx.run(st, ask, write=False):
                return []
    wanted = Claim(grp, names, worker_id, lease, limit, partition, per_stream)
    rows = await _ask(st, wanted)
    for _ in range(RECOVERIES):
        if rows is not None:
            break
        await tx.run(st, lambda conn: upkeep.recover_tx(st, conn, grp, names))
        rows = await _ask(st, wanted)
    # Built after the commit: no lock is held meanwhile.
    keyring = st._keyring
    claimed = [codec.row_to_task(row, keyring) for row in rows or ()]
    # Every task this store leased is remembered, with whether what its holder
    # writes is sealed (a sealed task, or one of an encrypted queue): its writes
    # then need no look-up of their own (sealing).
    encrypted = keyring.encrypted
    for row in rows or ():
        keyring.hold(row.id, row.queue in encrypted or row.payload.startswith(MARK))
    if claimed:
        st._busy.add(busy_key)
    else:
        st._busy.discard(busy_key)
    return claimed


async def _ask(st: Seam, wanted: Claim) -> Sequence[Any] | None:
    """One claim: by the claim hook, and by the flow-controlled path
    (:mod:`.limits`) for the queues that have limits, at once for those this
    store knows of, after the hook for those it tells of."""
    if any(queue in st._limited for queue in wanted.queues):
        return await limits.claim(st, wanted)
    rows = await st._claim(wanted)
    if rows is None or len(rows) >= wanted.limit:
        return rows
    limited = [queue for queue in wanted.queues if queue in st._limited]
    if not limited:
        return rows
    rest = replace(wanted, queues=limited, limit=wanted.limit - len(rows))
    # None (a lease of those queues expired): what the hook leased stands, and
    # the next claim recovers first.
    return [*rows, *(await limits.claim(st, rest) or ())]


Values = Callable[[ColumnElement[int]], dict[str, Any]]


def heartbeat_values(lease_s: float | None) -> Values:
    """A heartbeat: the lease runs ``lease_s`` (default: its claimed length) from now."""

    def values(now: ColumnElement[int]) -> dict[str, Any]:
        length: Any = d.c.lease if lease_s is None else lease_s
        return {
            "lease_expires_at": now + q.seconds_to_us(length),
            **({"lease": lease_s} if lease_s is not None else {}),
        }

    return values


def progress_values(progress: float | None, message: str | None) -> Values:
    """A progress report (a no-op write when neither is given: still fenced)."""

    def values(now: ColumnElement[int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if progress is not None:
            out["progress"] = float(progress)
        if message is not None:
            out["progress_message"] = message
        return out or {"worker_id": d.c.worker_id}

    return values


def snooze_values(delay_s: float) -> Values:
    """A snooze: queued again ``delay_s`` from now without spending an attempt.

    The attempt number is not given back (attempt numbers are the fencing token
    and only grow); the budget grows by one instead, so the attempts left are
    what they were before this run.
    """

    def values(now: ColumnElement[int]) -> dict[str, Any]:
        return {
            "status": q.QUEUED,
            "run_at": now + q.seconds_to_us(delay_s),
            "max_attempts": d.c.max_attempts + 1,
            "lease_expires_at": None,
            "worker_id": None,
            "progress": None,
            "progress_message": None,
        }

    return values


def release_values(now: ColumnElement[int]) -> dict[str, Any]:
    """A release: queued again at once, without spending the budget. The attempt
    number stays (the next claim takes a new one: attempt numbers only grow, so the
    released run's fence never matches a later run); ``max_attempts`` grows by one
    instead, so the run that reached no outcome costs nothing."""
    return {
        "status": q.QUEUED,
        "run_at": now,
        "max_attempts": d.c.max_attempts + 1,
        "lease_expires_at": None,
        "worker_id": None,
        "progress": None,
        "progress_message": None,
    }


async def owned_write(
    st: Seam,
    task_id: str,
    worker_id: str,
    group: str | None,
    attempt: int | None,
    values: Values,
) -> Task:
    """Validate the fence's arguments and apply ``values`` in its own transaction
    (heartbeat, progress, release, snooze: a success is :func:`.acks.succeed`)."""
    grp = codec.group_key(group)
    task_id = v.name("task_id", task_id)
    worker_id = v.name("worker_id", worker_id)
    if attempt is not None:
        attempt = v.positive_int("attempt", attempt)

    async def work(conn: AsyncConnection) -> Task:
        return await owned_update(
            st, conn, task_id, grp, worker_id, attempt, values(tx.now(st)), done=False
        )

    return await tx.run(st, work)


async def owned_update(
    st: Seam,
    conn: AsyncConnection,
    task_id: str,
    grp: str,
    worker_id: str,
    attempt: int | None,
    values: dict[str, Any],
    *,
    done: bool,
    stream_locked: bool = False,
) -> Task:
    """Apply ``values`` to the row if it is leased to ``worker_id`` (the fence);
    otherwise raise why not. Refreshes the stream and announces what changed.

    A status change moves the row's stream, so its stream row is locked first (the
    lock order, see :mod:`.streams`) unless the caller did (``stream_locked``).
    """
    owned = q.owned(task_id, grp, worker_id, attempt)

    async def write(*only: ColumnElement[bool]) -> Any:
        stmt = update(d).where(*owned, *only).values(**values)
        return (await conn.execute(st._returning_view(stmt))).first()

    if "status" in values and not stream_locked:
        # Unpartitioned rows have no stream: one statement. Otherwise find the
        # stream (a task's partition never changes), lock it, then write. (SQLite
        # locks nothing, its one writer holding the database: two reads more, on
        # a partitioned row's fail or release only.)
        row = await write(d.c.partition.is_(None))
        if row is None:
            where = (await conn.execute(select(d.c.queue, d.c.partition).where(*owned))).first()
            if where is not None:
                await streams.lock_streams(st, conn, [(where.queue, grp, where.partition)])
                row = await write()
    else:
        row = await write()
    if row is None:
        await explain_lost(conn, task_id, grp)
    assert row is not None
    if row.partition is not None and "status" in values:
        await streams.refresh(st, conn, [(row.queue, grp, row.partition)])
    if done:
        await st._notify(conn, {row.queue}, done=True, task_ids=[task_id])
    if (done and row.partition is not None) or values.get("status") == q.QUEUED:
        # New work: a retry, or the stream's next task may be claimable now.
        await st._notify(conn, {row.queue}, done=False)
    return codec.row_to_task(row, st._keyring)


async def fail_tx(
    st: Seam,
    conn: AsyncConnection,
    task_id: str,
    grp: str,
    worker_id: str,
    attempt: int | None,
    encoded: str,
    retryable: bool,
    delay_s: float | None,
) -> tuple[Task, bool]:
    """Record a failed attempt: queued again after a delay while ``retryable`` and
    attempts remain, else ``failed``. Returns the task and whether it will run again."""
    row = (
        await conn.execute(
            select(
                d.c.task_seq, d.c.attempt, d.c.max_attempts, d.c.partition, t.c.backoff, t.c.queue
            )
            .select_from(d.join(t, t.c.seq == d.c.task_seq))
            .where(*q.owned(task_id, grp, worker_id, attempt))
        )
    ).first()
    if row is None:
        await explain_lost(conn, task_id, grp)
    assert row is not None
    # The lock order: the stream row before the delivery row (re-checked below).
    await streams.lock_streams(st, conn, [(row.queue, grp, row.partition)])
    again = retryable and row.attempt < row.max_attempts
    now = tx.now(st)
    if again:
        if delay_s is None:
            spec = json.loads(row.backoff) if row.backoff else await queue_backoff(conn, row.queue)
            wait_s = v.backoff_delay(spec, row.attempt)
        else:
            wait_s = delay_s
        values: dict[str, Any] = {
            "status": q.QUEUED,
            "error": encoded,
            "lease_expires_at": None,
            "worker_id": None,
            "run_at": now + q.seconds_to_us(wait_s),
        }
    else:
        values = {
            "status": "failed",
            "error": encoded,
            "lease_expires_at": None,
            "finished_at": now,
        }
    task = await owned_update(
        st, conn, task_id, grp, worker_id, attempt, values, done=not again, stream_locked=True
    )
    if not again:
        await dead_letters.send(st, conn, [(row.task_seq, grp)])
    return task, again


async def queue_backoff(conn: AsyncConnection, queue: str) -> dict[str, float] | None:
    """The stored backoff setting of ``queue``, if any."""
    raw = (await conn.execute(select(qs.c.backoff).where(qs.c.queue == queue))).scalar()
    return None if raw is None else dict(json.loads(raw))


async def explain_lost(conn: AsyncConnection, task_id: str, grp: str) -> None:
    """Raise why a fenced write matched nothing: NotFound, TaskCancelled or LostLease."""
    status = (
        await conn.execute(
            select(d.c.status).where(d.c.task_seq == q.task_seq_of(task_id), d.c.grp == grp)
        )
    ).scalar()
    if status is None:
        raise NotFound(f"task {task_id}" + (f" for group {grp!r}" if grp else ""))
    if status == "cancelled":
        raise TaskCancelled(task_id)
    raise LostLease(task_id)
