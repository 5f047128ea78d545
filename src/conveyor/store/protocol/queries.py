"""Named SQL statements, written once in SQLAlchemy Core for both backends.

Each function builds one statement. Time-dependent statements take ``now``, a
SQL expression supplied by the dialect's clock (the database clock on Postgres,
a bound process-clock value on SQLite), so the same text runs on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Delete,
    Select,
    String,
    Update,
    and_,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.functions import FunctionElement

from conveyor.schema import counts as cn
from conveyor.schema import deliveries as d
from conveyor.schema import group_claims as gc
from conveyor.schema import pauses as pz
from conveyor.schema import streams as s
from conveyor.schema import tasks as t

QUEUED = "queued"
RUNNING = "running"
ACTIVE = (QUEUED, RUNNING)
WAITING = "waiting"
#: What cancel() withdraws: the active rows and a child waiting for its parents
#: (only queue mode has those). Not ACTIVE itself: that tuple is written into
#: statements that a partial index over partitioned rows must match.
CANCELLABLE = (QUEUED, RUNNING, WAITING)
DEFAULT_LEASE = 30.0
QUEUE_MODE = ""  # the delivery ``grp`` of queue mode; group names are never empty

Now = ColumnElement[int]


class by_code_point(FunctionElement[str]):
    """A text column compared by code point, as Python sorts ``str``: for the lock
    order, which Python-sorted keys and SQL ``ORDER BY`` must agree on whatever
    the database's collation (in ICU's ``en-US`` ``'a'`` sorts before ``'B'``;
    by code point after it)."""

    type = String()
    inherit_cache = True


@compiles(by_code_point)
def _by_code_point(element: by_code_point, compiler: SQLCompiler, **kw: Any) -> str:
    # SQLite compares text with its BINARY collation unless told otherwise, which
    # is code-point order for UTF-8; it has no collation named "C".
    return str(compiler.process(element.clauses, **kw))


@compiles(by_code_point, "postgresql")
def _by_code_point_pg(element: by_code_point, compiler: SQLCompiler, **kw: Any) -> str:
    # Postgres sorts by the database's collation; "C" is byte order, which for
    # UTF-8 is code-point order.
    return f'{compiler.process(element.clauses, **kw)} COLLATE "C"'


def is_status(value: str) -> ColumnElement[bool]:
    """``status = '<value>'`` with the value written inline, never bound.

    SQLite matches a bound ``status = ?`` to a partial index's ``status = 'queued'``
    by reading the bound value while it plans, and then marks the statement to be
    planned again whenever that parameter is bound: every run of a statement built
    once re-prepared it (a claim's lease step, 13 correlated lookups, cost ~200 µs
    of parsing and planning under the write lock per call instead of ~15 µs)."""
    return d.c.status == literal_column(f"'{value}'")


#: The delivery columns a new row is seeded with (the rest start NULL).
SEEDED = [
    "task_seq",
    "grp",
    "queue",
    "partition",
    "priority",
    "max_attempts",
    "status",
    "attempt",
    "run_at",
]


def seconds_to_us(seconds: ColumnElement[Any] | float) -> ColumnElement[int]:
    """Seconds (a number or SQL expression) as integer microseconds."""
    return cast(func.round(literal(1_000_000.0) * seconds), BigInteger)


def view_columns() -> list[ColumnElement[Any]]:
    """Every column a :class:`Task` needs."""
    return [
        t.c.seq,
        t.c.id,
        t.c.name,
        t.c.queue,
        t.c.partition,
        t.c.payload,
        t.c.metadata,
        t.c.priority,
        d.c.max_attempts,
        t.c.created_at,
        t.c.key,
        t.c.parent_id,
        t.c.root_id,
        t.c.correlation_id,
        d.c.grp,
        d.c.status,
        d.c.attempt,
        d.c.run_at,
        d.c.started_at,
        d.c.finished_at,
        d.c.lease_expires_at,
        d.c.worker_id,
        d.c.progress,
        d.c.progress_message,
        d.c.result,
        d.c.error,
        d.c.lease,
    ]


def task_view(grp: str) -> Select[Any]:
    """The task as queue mode (``grp=''``) or a group sees it."""
    return (
        select(*view_columns())
        .select_from(t.join(d, d.c.task_seq == t.c.seq))
        .where(d.c.grp == grp)
    )


def task_seq_of(task_id: str) -> ColumnElement[Any]:
    """The internal sequence number of a public task id, as a scalar subquery."""
    return select(t.c.seq).where(t.c.id == task_id).scalar_subquery()


def backfill(
    queue: str, grp: str, start_at: int | None, after: int = 0, upto: int | None = None
) -> Insert:
    """Delivery rows for a newly subscribed group: the retained history from its start,
    the tasks with ``after < seq <= upto`` (one chunk of a long history).

    A task already cancelled for queue mode is withdrawn, so it arrives cancelled.
    """
    qm = d.alias("qm")
    mine = d.alias("mine")
    cond = [t.c.queue == queue, t.c.seq > after]
    if upto is not None:
        cond.append(t.c.seq <= upto)
    if start_at is not None:
        cond.append(t.c.created_at >= start_at)
    source = (
        select(
            t.c.seq,
            literal(grp),
            t.c.queue,
            t.c.partition,
            t.c.priority,
            t.c.max_attempts,
            case((qm.c.status == "cancelled", literal("cancelled")), else_=literal(QUEUED)),
            literal(0),
            t.c.run_at,
            case((qm.c.status == "cancelled", qm.c.finished_at), else_=null()),
            t.c.concurrency_key,
        )
        .select_from(t.outerjoin(qm, and_(qm.c.task_seq == t.c.seq, qm.c.grp == QUEUE_MODE)))
        .where(
            *cond,
            ~exists().where(mine.c.task_seq == t.c.seq, mine.c.grp == grp),
        )
    )
    return d.insert().from_select([*SEEDED, "finished_at", "concurrency_key"], source)


def ready_plain(grp: str, queues: Sequence[str], now: Now) -> Select[Any]:
    """Claimable unpartitioned rows in claim order (served by the ``ready`` index)."""
    return (
        select(d.c.task_seq, d.c.priority, d.c.run_at)
        .where(
            d.c.grp == grp,
            d.c.queue.in_(queues),
            is_status(QUEUED),
            d.c.partition.is_(None),
            d.c.run_at <= now,
        )
        .order_by(d.c.priority.desc(), d.c.run_at, d.c.task_seq)
    )


def ready_streams(grp: str, queues: Sequence[str], now: Now, partition: str | None) -> Select[Any]:
    """Free streams whose head is ready, fairest (longest-waiting head) first."""
    stmt = select(s.c.queue, s.c.partition, s.c.priority, s.c.available_at).where(
        s.c.grp == grp,
        s.c.queue.in_(queues),
        s.c.available_at.is_not(None),
        s.c.available_at <= now,
    )
    if partition is not None:
        stmt = stmt.where(s.c.partition == partition)
    return stmt.order_by(s.c.priority.desc(), s.c.available_at).limit(1)


def unpaused(queue: Any, grp: str) -> ColumnElement[bool]:
    """No pause covers ``queue`` (a column or a value) for ``grp``: neither the
    whole queue's (``grp`` ``''``) nor the group's (:mod:`.pauses`)."""
    return ~select(pz.c.queue).where(pz.c.queue == queue, pz.c.grp.in_([QUEUE_MODE, grp])).exists()


def claim_probe(grp: str, queues: Sequence[str], now: Now, partition: str | None) -> Select[Any]:
    """One row of flags: could a claim find anything (a free stream, ready plain
    work, expired leases)? Read-only and cheap: each flag is one index probe. Work
    of a paused queue is not claimable: its idle workers sleep, and resume wakes
    them."""
    checks: list[Any] = [
        ready_streams(grp, queues, now, partition).where(unpaused(s.c.queue, grp)).exists()
    ]
    if partition is None:
        checks.append(
            ready_plain(grp, queues, now).where(unpaused(d.c.queue, grp)).limit(1).exists()
        )
    checks.append(select(d.c.task_seq).where(*expired(now, grp, queues)).exists())
    return select(*checks)


def expired(now: Now, grp: str | None, queues: Sequence[str] | None) -> list[ColumnElement[bool]]:
    """Running rows whose lease has run out (served by the ``leased`` index)."""
    cond: list[ColumnElement[bool]] = [is_status(RUNNING), d.c.lease_expires_at < now]
    if grp is not None:
        cond.append(d.c.grp == grp)
    if queues is not None:
        cond.append(d.c.queue.in_(queues))
    return cond


def recover_expired(
    now: Now,
    grp: str | None,
    queues: Sequence[str] | None,
    error: str,
    rows: Sequence[tuple[int, str]] | None = None,
) -> Update:
    """Expired leases: claimable again at once while attempts remain, else ``failed``
    with ``error`` (one statement for both outcomes). ``rows`` narrows it to the
    (task_seq, grp) pairs found (and their streams locked) beforehand."""
    last = d.c.attempt >= d.c.max_attempts
    stmt = update(d)
    if rows is not None:
        stmt = stmt.where(tuple_(d.c.task_seq, d.c.grp).in_(rows))
    return (
        stmt.where(*expired(now, grp, queues))
        .values(
            status=case((last, literal("failed")), else_=literal(QUEUED)),
            finished_at=case((last, now), else_=null()),
            error=case((last, literal(error)), else_=d.c.error),
            lease_expires_at=None,
            worker_id=case((last, d.c.worker_id), else_=null()),
        )
        .returning(d.c.queue, d.c.grp, d.c.partition, d.c.status, d.c.task_seq)
    )


def owned(task_id: str, grp: str, worker_id: str, attempt: int | None) -> list[ColumnElement[bool]]:
    """The row is leased to this worker (and, when given, on this attempt)."""
    cond: list[ColumnElement[bool]] = [
        d.c.task_seq == task_seq_of(task_id),
        d.c.grp == grp,
        is_status(RUNNING),
        d.c.worker_id == worker_id,
    ]
    if attempt is not None:
        cond.append(d.c.attempt == attempt)
    return cond


def active() -> ColumnElement[bool]:
    """``status IN ('queued', 'running')`` with the values written inline.

    SQLite uses a partial index only when it can prove the query implies the index's
    WHERE; it substitutes a bound ``status = ?`` but not a bound ``IN (?, ?)`` list,
    and would then walk the primary key through the whole finished history."""
    return d.c.status.in_([literal(value, literal_execute=True) for value in ACTIVE])


def delete_group(queue: str, grp: str) -> list[Delete]:
    """Remove a group's stream, delivery, count and claim-time rows (stream rows
    first: the lock order; the claim-time row last, which a claim's note locks
    alone, waiting on nothing else)."""
    return [
        delete(s).where(s.c.queue == queue, s.c.grp == grp),
        delete(d).where(d.c.queue == queue, d.c.grp == grp),
        delete(cn).where(cn.c.queue == queue, cn.c.grp == grp),
        delete(gc).where(gc.c.queue == queue, gc.c.grp == grp),
    ]


def unrolled() -> list[ColumnElement[bool]]:
    """Rows not yet folded into ``conveyor_counts``, leased rows aside (count those
    with :func:`is_status` ``RUNNING``). Written as literals so both planners match
    it to the partial index ``ix_conveyor_deliveries_unrolled`` (on Postgres it
    leaves leased rows out, see schema.py)."""
    return [d.c.rolled == literal_column("0"), d.c.status != literal_column(f"'{RUNNING}'")]


def claimable(now: Now | int) -> list[ColumnElement[bool]]:
    """Rows a claim could take now: queued and due, and unpartitioned or the head of
    a free stream (a task blocked behind its stream's head is not claimable)."""
    return [
        is_status(QUEUED),
        d.c.run_at <= now,
        or_(
            d.c.partition.is_(None),
            exists().where(
                s.c.queue == d.c.queue,
                s.c.grp == d.c.grp,
                s.c.partition == d.c.partition,
                s.c.head_seq == d.c.task_seq,
                s.c.available_at.is_not(None),
            ),
        ),
    ]


def stream_lock_order() -> tuple[by_code_point, ...]:
    """``ORDER BY`` of stream rows in the lock order: (grp, queue, partition), each
    by code point, the order :func:`conveyor.store.protocol.streams.lock_order` sorts keys in."""
    return (by_code_point(s.c.grp), by_code_point(s.c.queue), by_code_point(s.c.partition))


def stream_rows_of(keys: Sequence[tuple[str, str, str]]) -> Select[Any]:
    """The existing stream rows of ``keys`` — (grp, queue, partition) triples — in
    the lock order (grp, queue, partition)."""
    return (
        select(s.c.grp, s.c.queue, s.c.partition)
        .where(tuple_(s.c.grp, s.c.queue, s.c.partition).in_(keys))
        .order_by(*stream_lock_order())
    )


def partition_streams(pairs: Sequence[tuple[str, str]], grp: str | None) -> Select[Any]:
    """The stream rows of (queue, partition) ``pairs`` — of every group, or of
    ``grp`` — in the lock order (grp, queue, partition)."""
    stmt = select(s.c.grp, s.c.queue, s.c.partition).where(
        tuple_(s.c.queue, s.c.partition).in_(pairs)
    )
    if grp is not None:
        stmt = stmt.where(s.c.grp == grp)
    return stmt.order_by(*stream_lock_order())


def idle_streams(limit: int) -> Select[Any]:
    """Stream rows with no head (nothing active in the stream), in lock order."""
    return (
        select(s.c.grp, s.c.queue, s.c.partition)
        .where(s.c.head_seq.is_(None))
        .order_by(*stream_lock_order())
        .limit(limit)
    )


def busy_streams(keys: Sequence[tuple[str, str, str]]) -> Select[Any]:
    """Which of the (grp, queue, partition) ``keys`` still have an active row."""
    return (
        select(d.c.grp, d.c.queue, d.c.partition)
        .where(tuple_(d.c.grp, d.c.queue, d.c.partition).in_(keys), active())
        .distinct()
    )


def delete_streams(keys: Sequence[tuple[str, str, str]]) -> Delete:
    """Delete the (grp, queue, partition) stream rows ``keys`` that are still empty."""
    return delete(s).where(
        tuple_(s.c.grp, s.c.queue, s.c.partition).in_(keys), s.c.head_seq.is_(None)
    )
