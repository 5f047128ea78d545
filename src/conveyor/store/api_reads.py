"""Reads for dashboards and metrics: who holds what, how streams stand, throughput.

Every read here is bounded by live work (leased rows, active stream rows, the
rows finished since the last roll-up) or by small roll-up tables — never by
the finished history — so a dashboard refreshing every few seconds, or a
Prometheus scrape, costs the same on a store with a million finished tasks as
on an empty one.

The throughput and totals roll-ups are written by
:func:`conveyor.store.protocol.observed.fold_observed`, which the store's roll-up
(run by ``maintain()``, see :mod:`.protocol.upkeep`) calls for each batch of
finished rows it folds, and retention for rows it deletes before they were
folded; the acknowledgement path writes nothing extra.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from conveyor import _values as v
from conveyor.errors import InvalidArgument
from conveyor.models import (
    Status,
    StreamInfo,
    StreamReport,
    Task,
    ThroughputPoint,
    WorkerLeases,
)
from conveyor.schema import deliveries as d
from conveyor.schema import streams as s
from conveyor.schema import tasks as t
from conveyor.schema import throughput as tp
from conveyor.schema import totals as tt
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol import upkeep
from conveyor.store.protocol.codec import row_to_task as _task
from conveyor.store.protocol.observed import MINUTE_US, THROUGHPUT_KEEP_MINUTES
from conveyor.store.protocol.presence import live_workers
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

MAX_MINUTES = THROUGHPUT_KEEP_MINUTES
TERMINAL = tuple(st.value for st in Status if st.terminal)
MAX_INSPECT = 1_000


def _grp(group: str | None) -> str:
    return v.opt_name("group", group) or q.QUEUE_MODE


class InspectReads(Seam):
    """The store's read operations for dashboards and metrics (a base of TaskStore)."""

    # ------------------------------------------------------------- reads
    async def workers(self, *, limit: int = MAX_INSPECT) -> builtins.list[WorkerLeases]:
        """The live workers: those whose announcement has not expired (see
        :meth:`announce_worker`; every Worker announces itself, busy or idle) and
        those holding leases, each with the tasks it holds (queue mode and groups)
        and when it was last seen (announcement, claim or heartbeat); most
        recently seen first. Reads only leased rows and the live workers' rows;
        at most ``limit`` tasks in all."""
        limit = v.positive_int("limit", limit)

        async def work(conn: AsyncConnection) -> tuple[builtins.list[Any], builtins.list[Any]]:
            stmt = (
                select(*q.view_columns(), d.c.lease)
                .select_from(t.join(d, d.c.task_seq == t.c.seq))
                .where(q.is_status(q.RUNNING))
                .order_by(d.c.worker_id, d.c.task_seq)
                .limit(limit)
            )
            return builtins.list(await conn.execute(stmt)), await live_workers(self, conn)

        rows, announced = await tx.run(self, work, write=False, replica=True)
        by_worker: dict[str, builtins.list[Task]] = {}
        seen: dict[str, int] = {}
        for row in rows:
            task = _task(row, self._keyring)
            wid = task.worker_id or "?"
            by_worker.setdefault(wid, []).append(task)
            m = row._mapping
            if m["lease_expires_at"] is not None:
                beat = int(m["lease_expires_at"]) - round(float(m["lease"] or 0.0) * v.US)
                seen[wid] = max(seen.get(wid, beat), beat)
        out = {
            wid: WorkerLeases(worker_id=wid, tasks=tasks, last_seen=v.from_us(seen.get(wid, 0)))
            for wid, tasks in by_worker.items()
        }
        for a in announced:
            held = out.get(a.worker_id)
            out[a.worker_id] = WorkerLeases(
                worker_id=a.worker_id,
                tasks=[] if held is None else held.tasks,
                last_seen=a.seen_at if held is None else max(a.seen_at, held.last_seen),
                queues=a.queues,
                group=a.group,
                concurrency=a.concurrency,
                host=a.host,
                pid=a.pid,
                started_at=a.started_at,
            )
        return sorted(out.values(), key=lambda w: (w.last_seen, w.worker_id), reverse=True)

    async def deliveries(self, task_id: str) -> builtins.list[Task]:
        """Every view of one task: queue mode first, then each consumer group that
        has it, by name. Empty if there is no such task."""
        task_id = v.name("task_id", task_id)

        async def work(conn: AsyncConnection) -> builtins.list[Any]:
            stmt = (
                select(*q.view_columns())
                .select_from(t.join(d, d.c.task_seq == t.c.seq))
                .where(t.c.id == task_id, d.c.task_seq == q.task_seq_of(task_id))
                .order_by(d.c.grp)
            )
            return builtins.list(await conn.execute(stmt))

        return [
            _task(row, self._keyring) for row in await tx.run(self, work, write=False, replica=True)
        ]

    async def children(self, task_id: str, *, limit: int = 100) -> builtins.list[Task]:
        """Tasks submitted with ``parent=task_id`` (queue-mode view), in submit order,
        at most ``limit``."""
        task_id = v.name("task_id", task_id)
        limit = v.positive_int("limit", limit)
        if limit > MAX_INSPECT:
            raise InvalidArgument("limit", f"must be at most {MAX_INSPECT}, got {limit}")

        async def work(conn: AsyncConnection) -> builtins.list[Any]:
            stmt = (
                q.task_view(q.QUEUE_MODE)
                .where(t.c.parent_id == task_id)
                .order_by(t.c.seq)
                .limit(limit)
            )
            return builtins.list(await conn.execute(stmt))

        return [
            _task(row, self._keyring) for row in await tx.run(self, work, write=False, replica=True)
        ]

    async def queue_settings(self) -> builtins.list[dict[str, Any]]:
        """The stored settings of every configured queue, by name (see ``get_queue``)."""
        return await tx.run(self, upkeep.all_settings_tx, write=False)

    async def streams(
        self, queue: str, *, group: str | None = None, limit: int = 10
    ) -> StreamReport:
        """The busiest streams of ``queue`` (most queued and running tasks) and the
        most-blocked ones (whose head cannot be claimed now, the longest-waiting —
        earliest submitted — head first), at most ``limit`` of each, each with its
        head task and why it waits. Reads only active stream rows and the stream
        registry."""
        queue = v.name("queue", queue)
        grp = _grp(group)
        limit = v.positive_int("limit", limit)
        if limit > MAX_INSPECT:
            raise InvalidArgument("limit", f"must be at most {MAX_INSPECT}, got {limit}")

        async def work(
            conn: AsyncConnection,
        ) -> tuple[int, dict[str, int], dict[str, int], dict[str, int], dict[int, Any]]:
            now = await tx.now_us(self, conn)
            # Queued and running tasks per stream: active rows only (a partial index).
            depth = {
                row.partition: int(row.n)
                for row in await conn.execute(
                    select(d.c.partition, func.count().label("n"))
                    .where(
                        d.c.grp == grp,
                        d.c.queue == queue,
                        d.c.partition.is_not(None),
                        q.active(),
                    )
                    .group_by(d.c.partition)
                )
            }
            # Blocked: the stream has a head that is not available now. Oldest head
            # (the one submitted first) first.
            blocked = {
                row.partition: row.head_seq
                for row in await conn.execute(
                    select(s.c.partition, s.c.head_seq)
                    .where(
                        s.c.queue == queue,
                        s.c.grp == grp,
                        s.c.head_seq.is_not(None),
                        (s.c.available_at.is_(None)) | (s.c.available_at > now),
                    )
                    .order_by(s.c.head_seq)
                    .limit(limit)
                )
            }
            busiest = sorted(depth, key=lambda p: (-depth[p], p))[:limit]
            heads = dict(blocked)
            wanted = sorted(set(busiest) - set(heads))
            if wanted:
                for row in await conn.execute(
                    select(s.c.partition, s.c.head_seq).where(
                        s.c.queue == queue, s.c.grp == grp, s.c.partition.in_(wanted)
                    )
                ):
                    if row.head_seq is not None:
                        heads[row.partition] = row.head_seq
            seqs = sorted(set(heads.values()))
            tasks: dict[int, Any] = {}
            if seqs:
                for row in await conn.execute(
                    q.task_view(grp).where(t.c.seq.in_(seqs), d.c.task_seq.in_(seqs))
                ):
                    tasks[row.seq] = row
            return now, depth, blocked, heads, tasks

        now, counts, blocked, heads_of, found = await tx.run(self, work, write=False, replica=True)

        def info(partition: str) -> StreamInfo:
            head_row = found.get(heads_of.get(partition, -1))
            head = None if head_row is None else _task(head_row, self._keyring)
            reason: str | None = None
            until = None
            if partition in blocked and head is not None:
                if head.status is Status.RUNNING:
                    reason, until = "leased", head.lease_expires_at
                elif v.to_us(head.run_at) > now:
                    reason = "retry" if head.attempt > 0 else "run_at"
                    until = head.run_at
                else:
                    # Queued and due, but a later task of the batch is still leased.
                    reason = "leased"
            return StreamInfo(
                queue=queue,
                group=grp or None,
                partition=partition,
                depth=counts.get(partition, 0),
                head=head,
                blocked=reason,
                until=until,
            )

        busiest = sorted(counts, key=lambda p: (-counts[p], p))[:limit]
        stuck = [info(p) for p in blocked]
        return StreamReport(
            busiest=[info(p) for p in busiest], blocked=[x for x in stuck if x.blocked]
        )

    async def throughput(
        self, queue: str | None = None, *, group: str | None = None, minutes: int = 60
    ) -> builtins.list[ThroughputPoint]:
        """Tasks finished per minute over the last ``minutes`` minutes (oldest first,
        the current minute last), by terminal status, for one queue or all, as queue
        mode or ``group`` sees them. A retried attempt is not a finish; a task that
        fails for good is."""
        if queue is not None:
            queue = v.name("queue", queue)
        grp = _grp(group)
        minutes = v.positive_int("minutes", minutes)
        if minutes > MAX_MINUTES:
            raise InvalidArgument("minutes", f"must be at most {MAX_MINUTES}, got {minutes}")

        async def work(conn: AsyncConnection) -> tuple[int, builtins.list[Any]]:
            now = await tx.now_us(self, conn)
            first = now // MINUTE_US - minutes + 1
            rolled = (
                select(tp.c.minute, tp.c.status, func.sum(tp.c.n))
                .where(tp.c.grp == grp, tp.c.minute >= first)
                .group_by(tp.c.minute, tp.c.status)
            )
            bucket = (d.c.finished_at // MINUTE_US).label("minute")
            live = (
                select(bucket, d.c.status, func.count())
                .where(
                    *q.unrolled(),
                    d.c.grp == grp,
                    d.c.status.in_(TERMINAL),
                    d.c.finished_at >= first * MINUTE_US,
                )
                .group_by(bucket, d.c.status)
            )
            if queue is not None:
                rolled = rolled.where(tp.c.queue == queue)
                live = live.where(d.c.queue == queue)
            rows = [*await conn.execute(rolled), *await conn.execute(live)]
            return first, rows

        first, rows = await tx.run(self, work, write=False, replica=True)
        points = [
            ThroughputPoint(
                minute=v.from_us((first + i) * MINUTE_US),
                counts={st: 0 for st in TERMINAL},
            )
            for i in range(minutes)
        ]
        for minute, status, n in rows:
            i = int(minute) - first
            if 0 <= i < minutes and status in points[i].counts:
                points[i].counts[status] += int(n)
        return points

    async def finished_totals(self) -> builtins.list[tuple[str, str | None, str, str, int]]:
        """Finished attempts ever, as ``(queue, group, name, status, n)``: monotonic
        counts for metrics (retention and retry do not lower them). Rows finished
        since the last roll-up are counted from the unrolled index."""

        async def work(conn: AsyncConnection) -> builtins.list[Any]:
            rolled = select(tt.c.queue, tt.c.grp, tt.c.name, tt.c.status, tt.c.n)
            live = (
                select(d.c.queue, d.c.grp, t.c.name, d.c.status, func.count())
                .select_from(d.join(t, t.c.seq == d.c.task_seq))
                .where(*q.unrolled(), d.c.status.in_(TERMINAL))
                .group_by(d.c.queue, d.c.grp, t.c.name, d.c.status)
            )
            return [*await conn.execute(rolled), *await conn.execute(live)]

        sums: dict[tuple[str, str, str, str], int] = {}
        for qn, grp, name, status, n in await tx.run(self, work, write=False, replica=True):
            key = (qn, grp, name, status)
            sums[key] = sums.get(key, 0) + int(n)
        return [(qn, grp or None, name, st, n) for (qn, grp, name, st), n in sorted(sums.items())]
