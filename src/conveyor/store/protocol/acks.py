"""Batch acknowledgement: checking ``succeed_many``/``ack_many`` items, the fenced
transaction that finishes them step by step (:func:`succeed_many_tx`), and
``ack_many``'s built-once statements where the dialect has them (one statement
for unpartitioned tasks; two, sent together, when streams move).

Each item is fenced on its own, as :mod:`conveyor.store.protocol.consumer`'s single
writes are: one item's failure does not hold back the others.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor import _values as v
from conveyor.errors import ConveyorError, InvalidArgument, LostLease, NotFound
from conveyor.models import Task
from conveyor.schema import tasks as t
from conveyor.store.protocol import codec, steps, streams, texts, wake
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol.consumer import explain_lost
from conveyor.store.seam import Seam

#: A validated succeed_many item: (index, task_id, worker_id, grp, attempt, result JSON).
AckItem = tuple[int, str, str, str, int | None, str]


def validate_acks(
    items: Iterable[Mapping[str, Any]], *, max_size: int | None = None
) -> tuple[list[Task | ConveyorError | None], list[AckItem]]:
    """Check succeed_many's items: ``(outcomes, todo)``, where ``outcomes`` holds an
    error at the index of each item whose result is not JSON or over ``max_size``
    bytes (``None`` elsewhere) and ``todo`` the items to acknowledge. Malformed
    items raise at once."""
    outcomes: list[Task | ConveyorError | None] = []
    todo: list[AckItem] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InvalidArgument(f"items[{i}]", "must be a dict of succeed() arguments")
        unknown = set(item) - {"task_id", "worker_id", "result", "group", "attempt"}
        if unknown:
            raise InvalidArgument(sorted(unknown)[0], "is not an argument of succeed()")
        task_id = v.name("task_id", item.get("task_id"))
        worker_id = v.name("worker_id", item.get("worker_id"))
        grp = codec.group_key(item.get("group"))
        attempt = item.get("attempt")
        if attempt is not None:
            attempt = v.positive_int("attempt", attempt)
        try:
            encoded = v.to_json("result", item.get("result"), max_size=max_size)
        except InvalidArgument as exc:
            outcomes.append(exc)
            continue
        outcomes.append(None)
        todo.append((i, task_id, worker_id, grp, attempt, encoded))
    return outcomes, todo


async def succeed_many_tx(
    st: Seam,
    conn: AsyncConnection,
    outcomes: list[Task | ConveyorError | None],
    todo: list[AckItem],
    *,
    read_back: bool = True,
) -> tuple[list[Task | ConveyorError | None], bool]:
    """Finish the leased ``todo`` items, each fenced on its own; fill ``outcomes``
    (a copy) at their indexes with the task (``read_back``; else left ``None``) or
    the error it met. Also returns whether a stream's head became claimable (idle
    claimers have something to find)."""
    out = list(outcomes)
    ids = sorted({item[1] for item in todo})
    idents = list(
        await conn.execute(select(t.c.id, t.c.seq, t.c.queue, t.c.partition).where(t.c.id.in_(ids)))
    )
    seq_of = {row.id: row.seq for row in idents}
    owners: dict[tuple[str, str], list[tuple[int, str, int | None, str]]] = {}
    for i, task_id, worker_id, grp, attempt, encoded in todo:
        owners.setdefault((worker_id, grp), []).append((i, task_id, attempt, encoded))
    # The lock order: every stream these acks may move, before any delivery row.
    where = {row.id: row for row in idents if row.partition is not None}
    await streams.lock_streams(
        st,
        conn,
        [(where[it[1]].queue, it[3], where[it[1]].partition) for it in todo if it[1] in where],
    )
    finished: list[str] = []
    queues: set[str] = set()
    touched: set[tuple[str, str, str]] = set()
    for (worker_id, grp), mine in owners.items():
        wanted = sorted({seq_of[m[1]] for m in mine if m[1] in seq_of})
        held = {}
        if wanted:
            locked = st._lock_rows(q.leased_to(grp, worker_id))
            held = {row.task_seq: row for row in await conn.execute(locked, {"seqs": wanted})}
        # The fence, per task: leased to this worker, on the attempt given.
        ok: dict[int, str] = {}
        for _i, task_id, attempt, encoded in mine:
            row = held.get(seq_of.get(task_id, -1))
            if row is not None and (attempt is None or row.attempt == attempt):
                ok.setdefault(row.task_seq, encoded)
        if ok:
            await conn.execute(
                q.finish_row(grp, tx.now(st)),
                [{"b_seq": seq, "b_result": res} for seq, res in ok.items()],
            )
            for seq in ok:
                queues.add(held[seq].queue)
                if held[seq].partition is not None:
                    touched.add((held[seq].queue, grp, held[seq].partition))
        tasks_by_seq: dict[Any, Task] = {}
        if ok and read_back:
            tasks_by_seq = await codec.fetch_tasks(conn, grp, seqs=sorted(ok))
        for i, task_id, _attempt, _encoded in mine:
            seq = seq_of.get(task_id, -1)
            if seq in ok:
                out[i] = tasks_by_seq.get(seq)
                finished.append(task_id)
                continue
            try:
                await explain_lost(conn, task_id, grp)
            except (LostLease, NotFound) as exc:
                out[i] = exc
    freed = await streams.refresh(st, conn, touched)
    if finished:
        await st._notify(conn, queues, done=True, task_ids=finished)
        if freed:
            await st._notify(conn, {key[0] for key in touched}, done=False)
    return out, freed


async def ack_many(
    st: Seam,
    outcomes: list[Task | ConveyorError | None],
    todo: list[AckItem],
    *,
    partitioned: bool = False,
) -> list[ConveyorError | None]:
    """Finish the ``todo`` items without reading tasks back: per item ``None`` when
    it was acknowledged, else its error. Unpartitioned rows go through the dialect's
    one-statement ack where there is one (skipped when the caller says the batch is
    ``partitioned``), partitioned ones through its stream acknowledgement; the rest
    (fence failures, to learn why; everything where the dialect has neither)
    through :func:`succeed_many_tx`."""
    left = todo
    # A batch known to hold partitioned rows skips the statement that leaves them.
    text = None if partitioned else await texts.get(st, "ack_plain")
    if text is not None:
        rows = await texts.alone(st, text, {"items": _ack_items(todo)})
        missed = {row.idx for row in rows if row.idx is not None}
        left = [item for n, item in enumerate(todo, 1) if n in missed]
        if len(left) < len(todo):
            wake.wake_local(st, work=False)
    if left:
        left = await _ack_streams(st, left)
    if left and await steps.ack_ready(st):
        # Step by step, each statement built once; the fence failures go on below.
        left, finished, moved = await tx.run(st, lambda conn: steps.ack_tx(st, conn, left))
        if finished:
            wake.wake_local(st, work=moved)
    out: list[Task | ConveyorError | None] = list(outcomes)
    if left:
        out, moved = await tx.run(
            st, lambda conn: succeed_many_tx(st, conn, outcomes, left, read_back=False)
        )
        wake.wake_local(st, work=moved)
    return [o if isinstance(o, ConveyorError) else None for o in out]


async def _ack_streams(st: Seam, todo: list[AckItem]) -> list[AckItem]:
    """Finish ``todo`` (partitioned rows among them) with the dialect's two-statement
    acknowledgement where it has one: lock the batch's streams in the lock order,
    then finish the rows and recompute the streams in one statement. Returns the
    items left: those that failed the fence (all of them without the texts)."""
    lock = await texts.get(st, "ack_streams_lock")
    ack = await texts.get(st, "ack_streams")
    if lock is None or ack is None:
        return todo
    params = {"items": _ack_items(todo)}
    rows = await texts.together(st, [(lock, params), (ack, params)])
    missed = {row.idx for row in rows if row.idx is not None}
    left = [item for n, item in enumerate(todo, 1) if n in missed]
    if len(left) < len(todo):
        # Waiters of finished tasks; idle workers too when a stream's head is free now.
        wake.wake_local(st, work=bool(rows[0].freed))
    return left


def _ack_items(todo: list[AckItem]) -> str:
    """The ``items`` parameter of the batch acknowledgement texts: one JSON array of
    ``[id, worker_id, grp, attempt, result]`` (the result as its JSON text)."""
    return json.dumps([item[1:] for item in todo], ensure_ascii=False, separators=(",", ":"))


__all__ = ["AckItem", "ack_many", "succeed_many_tx", "validate_acks"]
