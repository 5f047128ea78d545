"""Task dependencies (``submit(..., after=[...])``) and batches (``store.batch()``).

A child names its parents; it is written ``waiting`` (queue mode only) with
``waiting_on`` the number of its parents not yet terminal, one edge row per
parent in ``conveyor_dependencies``, and each parent's queue-mode row marked
``has_dependents``. The release is not run from here but by the database, in the
transaction that finishes the parent: the trigger of revision 0017 fires on any
update that moves a row with dependents to a terminal status, whichever path
runs it (acknowledgements, a final failure, a lease lost on the last attempt,
eviction, cancel, a replaced key's holder, the bulk actions). A child is queued
when its count reaches 0; a child whose parent failed, was cancelled or evicted
is cancelled with an error naming the parent, and its own children after it,
unless its edge runs on failure (``on_parent_failure="run"``).

The race between a child's submit and its parent's finish: the submit marks the
parent row (an UPDATE, so it waits for a finish in flight and reads the row
after it) and reads its status after that lock. Either the finish comes first
and the submit sees a terminal parent (resolved at once), or the mark comes
first and the finish's trigger sees ``has_dependents`` (Postgres re-reads a row
an UPDATE waited for; SQLite has one writer).

A batch is a waiting callback task: every task submitted into the batch is one
more parent of it, with the run-on-failure rule, and the batch's open hold is
one more count; ``close()`` takes the hold away, once (``conveyor_batches.closed``).
So the callback is queued exactly once, by whichever transaction resolves its
last count: the close, or the finish of the batch's last task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, case, insert, literal, select, update

from conveyor import _values as v
from conveyor.errors import InvalidArgument, NotFound
from conveyor.models import BatchInfo, Status, Task
from conveyor.schema import batches as bt
from conveyor.schema import deliveries as d
from conveyor.schema import dependencies as dep
from conveyor.schema import queues as qs
from conveyor.schema import tasks as t
from conveyor.store.protocol import codec, producer, texts, wake
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol.requests import Request
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

WAITING = q.WAITING
#: What a parent may be while its children wait for it.
UNFINISHED = (q.QUEUED, q.RUNNING, WAITING)


def parent_failed(parent_id: str, status: str) -> str:
    """The error a child cancelled for its parent carries (the trigger writes the
    same)."""
    return json.dumps(
        {
            "type": "ParentFailed",
            "code": "parent_failed",
            "message": f"parent {parent_id} {status}",
            "parent_id": parent_id,
            "parent_status": status,
        }
    )


@dataclass(slots=True)
class _Parents:
    """What a submit learned of the parents and batches it names, before writing."""

    seqs: dict[str, int]
    batches: dict[str, int]  # batch id -> callback seq


async def submit(st: Seam, reqs: list[Request]) -> list[Task]:
    """Submit ``reqs`` (some with ``after`` or ``batch``) in one transaction of
    the store's own."""
    tasks = await tx.run(st, lambda conn: submit_tx(st, conn, reqs))
    wake.wake_local(st, work=True)
    return tasks


async def submit_tx(st: Seam, conn: AsyncConnection, reqs: list[Request]) -> list[Task]:
    """Write ``reqs`` on ``conn`` (the store's transaction or a caller's): the
    parents and batches checked first (nothing written when one is missing), the
    tasks inserted step by step (``producer.submit_tx``, which seals what must be
    and counts a capped queue's depth), then linked."""
    found = await _check(st, conn, reqs)
    tasks = await producer.submit_tx(st, conn, reqs)
    new = [r for r, task in zip(reqs, tasks, strict=True) if task.id == r.id and r.linked]
    if not new:
        return tasks
    changed = await _link(st, conn, new, found)
    if not changed:
        return tasks
    fresh = await codec.fetch_tasks(conn, q.QUEUE_MODE, ids=changed, keyring=st._keyring)
    return [fresh.get(task.id, task) for task in tasks]


async def _check(st: Seam, conn: AsyncConnection, reqs: list[Request]) -> _Parents:
    """The parents' seqs and the batches' callbacks, or InvalidArgument (``after``:
    a parent that is not a task, or has no queue-mode row; ``batch``: unknown or
    closed)."""
    ids = sorted({p for r in reqs for p in (r.after or ())})
    seqs: dict[str, int] = {}
    if ids:
        rows = await conn.execute(
            select(t.c.id, t.c.seq, t.c.queue, d.c.status, qs.c.queue_mode)
            .select_from(
                t.outerjoin(d, and_(d.c.task_seq == t.c.seq, d.c.grp == q.QUEUE_MODE))
                # A queue consumed by groups only: its queue-mode rows are not work.
                .outerjoin(qs, qs.c.queue == t.c.queue)
            )
            .where(t.c.id.in_(ids))
        )
        for row in rows:
            if row.status is None or row.queue_mode is False:
                raise InvalidArgument(
                    "after",
                    f"task {row.id} has no queue-mode delivery (its queue {row.queue!r} "
                    "is consumed by groups only); only queue mode can be waited for",
                )
            seqs[row.id] = row.seq
        missing = [i for i in ids if i not in seqs]
        if missing:
            raise InvalidArgument("after", f"{missing[0]} is not a task")
    batches: dict[str, int] = {}
    wanted = sorted({r.batch_id for r in reqs if r.batch_id is not None})
    for batch_id in wanted:
        # Locked: a close() in flight is waited for, and none can start until this
        # submit's tasks are counted in.
        row = (
            await conn.execute(
                st._lock_rows(select(bt.c.callback_seq, bt.c.closed).where(bt.c.id == batch_id))
            )
        ).first()
        if row is None:
            raise InvalidArgument("batch", f"{batch_id} is not a batch")
        if row.closed:
            raise InvalidArgument("batch", f"batch {batch_id} is closed")
        batches[batch_id] = row.callback_seq
    return _Parents(seqs, batches)


async def _link(st: Seam, conn: AsyncConnection, reqs: list[Request], found: _Parents) -> list[str]:
    """The edges of the new tasks ``reqs`` written, their parents marked (and
    read after that lock), and each task made waiting, left queued or cancelled;
    the ids of the tasks whose row changed."""
    rows = await conn.execute(select(t.c.id, t.c.seq).where(t.c.id.in_([r.id for r in reqs])))
    own = {row.id: row.seq for row in rows}
    parents = sorted({found.seqs[p] for r in reqs for p in (r.after or ())})
    built = texts.on(st, conn)
    statuses: dict[int, str] = {}
    if parents:
        # The lock order among submits: by seq; the status read after the lock
        # (see the module's docstring).
        marked = await texts.execute(conn, st, built["mark_parents"], {"seqs": parents})
        statuses = {row.task_seq: row.status for row in marked}
    ids = {seq: i for i, seq in found.seqs.items()}
    edges: list[dict[str, Any]] = []
    children = sorted({own[r.id] for r in reqs if r.batch_id is not None})
    changed: list[str] = []
    plans: list[tuple[int, int, tuple[str, str] | None]] = []
    for r in reqs:
        seq = own[r.id]
        open_ = 0
        failed: tuple[str, str] | None = None
        for parent_id in r.after or ():
            p = found.seqs[parent_id]
            status = statuses[p]
            done = status not in UNFINISHED
            edges.append(
                {
                    "task_seq": seq,
                    "parent_seq": p,
                    "run_on_failure": r.run_on_failure,
                    "resolved": done,
                }
            )
            if not done:
                open_ += 1
            elif status != "succeeded" and not r.run_on_failure and failed is None:
                failed = (ids[p], status)
        if r.batch_id is not None:
            edges.append(
                {
                    "task_seq": found.batches[r.batch_id],
                    "parent_seq": seq,
                    "run_on_failure": True,
                    "resolved": False,
                }
            )
        if failed is not None or open_:
            changed.append(r.id)
        plans.append((seq, open_, failed))
    if edges:
        links = [
            [e["task_seq"], e["parent_seq"], e["run_on_failure"], e["resolved"]] for e in edges
        ]
        await texts.execute(conn, st, built["link_edges"], {"edges": links})
    if children:
        await conn.execute(
            update(d)
            .where(d.c.task_seq.in_(children), d.c.grp == q.QUEUE_MODE)
            .values(has_dependents=True)
        )
        for batch_id, callback in sorted(found.batches.items()):
            n = sum(1 for r in reqs if r.batch_id == batch_id)
            await conn.execute(
                update(d)
                .where(d.c.task_seq == callback, d.c.grp == q.QUEUE_MODE, q.is_status(WAITING))
                .values(waiting_on=d.c.waiting_on + n)
            )
    now = tx.now(st)
    waiting: dict[int, list[int]] = {}  # unresolved parents -> tasks: one UPDATE each
    for seq, open_, r_failed in plans:
        if r_failed is not None:
            # A parent already failed: cancelled now, which releases the task's own
            # batch callback through the trigger like any cancel.
            await conn.execute(
                update(d)
                .where(d.c.task_seq == seq, d.c.grp == q.QUEUE_MODE)
                .values(status="cancelled", finished_at=now, error=parent_failed(*r_failed))
            )
        elif open_:
            waiting.setdefault(open_, []).append(seq)
    for open_, seqs in sorted(waiting.items()):
        await conn.execute(
            update(d)
            .where(d.c.task_seq.in_(seqs), d.c.grp == q.QUEUE_MODE)
            .values(status=WAITING, waiting_on=open_)
        )
    return changed


# ---------------------------------------------------------------- batches
async def open_batch(st: Seam, callback: Request) -> tuple[str, Task]:
    """A new batch and its callback task (written waiting, held by the batch's
    open count); the batch's id and the callback."""
    batch_id = v.new_task_id()

    async def work(conn: AsyncConnection) -> Task:
        task = (await producer.submit_tx(st, conn, [callback]))[0]
        seq = (await conn.execute(select(t.c.seq).where(t.c.id == task.id))).scalar_one()
        await conn.execute(
            update(d)
            .where(d.c.task_seq == seq, d.c.grp == q.QUEUE_MODE)
            .values(status=WAITING, waiting_on=1, has_dependents=False)
        )
        await conn.execute(
            insert(bt).values(
                id=batch_id,
                queue=task.queue,
                callback_seq=seq,
                callback_id=task.id,
                closed=False,
                created_at=await tx.now_us(st, conn),
            )
        )
        fresh = await codec.fetch_tasks(conn, q.QUEUE_MODE, ids=[task.id], keyring=st._keyring)
        return fresh[task.id]

    return batch_id, await tx.run(st, work)


async def close_batch(st: Seam, batch_id: str) -> bool:
    """Close the batch: no task joins it any more, and its open hold is taken off
    the callback's count (queued now if every task of it is already terminal).
    False if it was closed already (closing twice is harmless)."""

    async def work(conn: AsyncConnection) -> bool:
        row = (
            await conn.execute(
                st._lock_rows(select(bt.c.callback_seq, bt.c.closed).where(bt.c.id == batch_id))
            )
        ).first()
        if row is None:
            raise NotFound(f"no batch {batch_id}")
        if row.closed:
            return False
        await conn.execute(update(bt).where(bt.c.id == batch_id).values(closed=True))
        last = d.c.waiting_on <= 1
        released = await conn.execute(
            update(d)
            .where(d.c.task_seq == row.callback_seq, d.c.grp == q.QUEUE_MODE, q.is_status(WAITING))
            .values(
                waiting_on=d.c.waiting_on - 1,
                status=case((last, literal(q.QUEUED)), else_=literal(WAITING)),
                run_at=case((last, tx.now(st)), else_=d.c.run_at),
            )
            .returning(d.c.queue, d.c.status)
        )
        queues = {r.queue for r in released if r.status == q.QUEUED}
        if queues:
            await st._notify(conn, queues, done=False)
        return True

    closed = await tx.run(st, work)
    wake.wake_local(st, work=True)
    return closed


async def get_batch(st: Seam, batch_id: str) -> BatchInfo | None:
    """The batch's progress, or None if there is no such batch."""

    async def work(conn: AsyncConnection) -> BatchInfo | None:
        row = (await conn.execute(select(bt).where(bt.c.id == batch_id))).first()
        if row is None:
            return None
        return await _info(conn, row)

    return await tx.run(st, work, write=False)


async def batch_of(st: Seam, callback_id: str) -> BatchInfo | None:
    """The batch whose callback is ``callback_id`` (None: it is none's)."""

    async def work(conn: AsyncConnection) -> BatchInfo | None:
        row = (await conn.execute(select(bt).where(bt.c.callback_id == callback_id))).first()
        return None if row is None else await _info(conn, row)

    return await tx.run(st, work, write=False)


async def _info(conn: AsyncConnection, row: Any) -> BatchInfo:
    members = await conn.execute(
        select(t.c.id, d.c.status)
        .select_from(
            dep.join(t, t.c.seq == dep.c.parent_seq).join(
                d, and_(d.c.task_seq == dep.c.parent_seq, d.c.grp == q.QUEUE_MODE)
            )
        )
        .where(dep.c.task_seq == row.callback_seq)
        .order_by(dep.c.parent_seq)
    )
    counts: dict[str, int] = {}
    by: dict[str, list[str]] = {"succeeded": [], "failed": [], "cancelled": []}
    total = 0
    for m in members:
        total += 1
        counts[m.status] = counts.get(m.status, 0) + 1
        kind = "failed" if m.status == "evicted" else m.status
        if kind in by:
            by[kind].append(m.id)
    cb = (
        await conn.execute(
            select(d.c.status).where(d.c.task_seq == row.callback_seq, d.c.grp == q.QUEUE_MODE)
        )
    ).scalar()
    return BatchInfo(
        id=row.id,
        queue=row.queue,
        closed=bool(row.closed),
        total=total,
        counts=counts,
        callback_id=row.callback_id,
        callback_status=Status(cb or "cancelled"),
        created_at=v.from_us(row.created_at),
        succeeded=by["succeeded"],
        failed=by["failed"],
        cancelled=by["cancelled"],
    )


# ------------------------------------------------------------ reading parents
async def parents_of(st: Seam, task_id: str) -> dict[str, Task]:
    """The parents of ``task_id`` (its ``after``, or a callback's batch tasks) as
    queue mode sees them, by id; NotFound if there is no such task."""

    async def work(conn: AsyncConnection) -> dict[str, Task]:
        seq = (await conn.execute(select(t.c.seq).where(t.c.id == task_id))).scalar()
        if seq is None:
            raise NotFound(f"no task {task_id}")
        seqs = list(
            (
                await conn.execute(
                    select(dep.c.parent_seq).where(dep.c.task_seq == seq).order_by(dep.c.parent_seq)
                )
            ).scalars()
        )
        if not seqs:
            return {}
        found = await codec.fetch_tasks(conn, q.QUEUE_MODE, seqs=seqs, keyring=st._keyring)
        return {found[s].id: found[s] for s in seqs if s in found}

    return await tx.run(st, work, write=False)


async def graph(
    st: Seam, task_id: str, *, limit: int = 200
) -> tuple[dict[str, Task], list[tuple[str, str]]]:
    """The dependency graph around ``task_id``: its ancestors and descendants
    through the edges (a batch's callback among them), at most ``limit`` tasks,
    nearest first; the tasks by id (queue mode's view) and the edges as
    ``(parent_id, child_id)``. Empty when the task has no edge."""

    async def work(conn: AsyncConnection) -> tuple[dict[str, Task], list[tuple[str, str]]]:
        seq = (await conn.execute(select(t.c.seq).where(t.c.id == task_id))).scalar()
        if seq is None:
            return {}, []
        seen = {seq}
        edges: set[tuple[int, int]] = set()
        frontier = [seq]
        while frontier and len(seen) < limit:
            rows = list(
                await conn.execute(
                    select(dep.c.parent_seq, dep.c.task_seq)
                    .where(dep.c.task_seq.in_(frontier) | dep.c.parent_seq.in_(frontier))
                    .order_by(dep.c.task_seq, dep.c.parent_seq)
                )
            )
            nxt: list[int] = []
            for row in rows:
                for end in (row.parent_seq, row.task_seq):
                    if end not in seen and len(seen) < limit:
                        seen.add(end)
                        nxt.append(end)
                if row.parent_seq in seen and row.task_seq in seen:
                    edges.add((row.parent_seq, row.task_seq))
            frontier = nxt
        if not edges:
            return {}, []
        found = await codec.fetch_tasks(conn, q.QUEUE_MODE, seqs=sorted(seen), keyring=st._keyring)
        ids = {s: task.id for s, task in found.items()}
        tasks = {task.id: task for task in found.values()}
        pairs = sorted((ids[p], ids[c]) for p, c in edges if p in ids and c in ids)
        return tasks, pairs

    return await tx.run(st, work, write=False)


__all__ = [
    "BatchInfo",
    "batch_of",
    "close_batch",
    "get_batch",
    "graph",
    "open_batch",
    "parent_failed",
    "parents_of",
    "submit",
    "submit_tx",
]
