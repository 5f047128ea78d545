"""Acknowledgement and submit step by step, each step a statement built once.

A dialect without a one-statement acknowledgement and submit (SQLite: no
data-modifying CTEs, no arrays) runs them as several statements in one
transaction. Built with SQLAlchemy Core on every call, those statements cost far
more client time than the database spends on them; here each is built once per
store (:mod:`conveyor.store.protocol.texts`), with the per-call values as named bind
parameters. The acknowledgement takes the steps of
:func:`.batch_ack.succeed_many_tx`. (The claim is the seam's claim hook:
:meth:`conveyor.store.seam.Seam._claim`.)

Covered: batch acknowledgement, and the submit of plain tasks, one
(:func:`.producer.submit_one_tx`) or many (:func:`.producer.submit_plain_tx`).
The rest (fence failures, to learn why; keys, partitions, parents) takes the
Core path.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.errors import InvalidArgument
from conveyor.store.protocol import streams, texts
from conveyor.store.protocol.requests import Request
from conveyor.store.seam import Seam

#: Bind parameters of the built-once steps (typed ``Any``: they stand where the
#: Core builders of :mod:`conveyor.store.protocol.queries` take Python values).
_GRP: Any = bindparam("grp")
_QUEUE: Any = bindparam("queue")

#: A validated acknowledgement: (index, task_id, worker_id, grp, attempt, result JSON).
AckItem = tuple[int, str, str, str, int | None, str]


#: The task columns a submit writes (the rest take their defaults).
_TASK_COLUMNS = (
    "id",
    "name",
    "queue",
    "partition",
    "payload",
    "metadata",
    "priority",
    "max_attempts",
    "backoff",
    "created_at",
    "run_at",
    "key",
    "parent_id",
    "root_id",
    "correlation_id",
)


def insert_params(row: dict[str, Any]) -> dict[str, Any]:
    """The parameters of ``step_submit_insert`` for a task row (named apart from the
    columns: a bind parameter may not share a column's name in VALUES)."""
    return {f"v_{name}": row[name] for name in _TASK_COLUMNS}


async def refresh_after(st: Seam, conn: AsyncConnection, after: int) -> None:
    """Recompute the streams the delivery rows of the tasks above ``after`` joined
    (those this transaction inserted, under the single writer lock), read with the
    built ``step_touched_after``; a missing stream row is created."""
    touched = st._texts.get("step_touched_after") if st._texts is not None else None
    assert touched is not None
    rows = await texts.execute(conn, st, touched, {"after": after})
    await streams.refresh(st, conn, [tuple(row) for row in rows])


async def parent_roots(st: Seam, conn: AsyncConnection, reqs: list[Request]) -> dict[str, str]:
    """The root of each parent of ``reqs``, by parent id, read with the built
    ``step_parent_root``; a parent that is not a task raises, as
    :func:`.producer.insert_tasks` does (the first missing one in sorted order)."""
    parents = sorted({r.parent_id for r in reqs if r.parent_id is not None})
    if not parents:
        return {}
    lookup = st._texts.get("step_parent_root") if st._texts is not None else None
    assert lookup is not None
    roots: dict[str, str] = {}
    for parent in parents:
        root = (await texts.execute(conn, st, lookup, {"parent": parent})).scalar()
        if root is None:
            raise InvalidArgument("parent", f"no task has id {parent!r}")
        roots[parent] = root
    return roots


async def ack_ready(st: Seam) -> bool:
    """Whether acknowledgements can take the built-once steps."""
    built = await texts.of(st)
    return "ack_held" in built and "step_finish" in built


async def ack_tx(
    st: Seam, conn: AsyncConnection, todo: list[AckItem]
) -> tuple[list[AckItem], list[str], bool]:
    """Finish the leased ``todo`` items on the built-once steps (see
    :func:`ack_ready`): per (worker, group), one lookup of the batch's rows leased
    to the worker, then one statement per row passing the fence. Returns the items
    that failed the fence (the caller learns why through
    :func:`.batch_ack.succeed_many_tx`), the finished task ids, and whether a
    stream's head became claimable (idle claimers have something to find)."""
    built = st._texts
    assert built is not None
    held_text, finish = built.get("ack_held"), built.get("step_finish")
    assert held_text is not None and finish is not None
    owners: dict[tuple[str, str], list[AckItem]] = {}
    for item in todo:
        owners.setdefault((item[2], item[3]), []).append(item)
    left: list[AckItem] = []
    finished: list[str] = []
    queues: set[str] = set()
    touched: set[tuple[str, str, str]] = set()
    for (worker_id, grp), mine in owners.items():
        params = {
            "ids": json.dumps(sorted({m[1] for m in mine})),
            "grp": grp,
            "worker_id": worker_id,
        }
        held = {row.id: row for row in await texts.execute(conn, st, held_text, params)}
        # The fence, per task: leased to this worker, on the attempt given.
        ok: dict[int, str] = {}
        for item in mine:
            row = held.get(item[1])
            attempt = item[4]
            if row is not None and (attempt is None or row.attempt == attempt):
                ok.setdefault(row.task_seq, item[5])
            else:
                left.append(item)
                continue
            finished.append(item[1])
            queues.add(row.queue)
            if row.partition is not None:
                touched.add((row.queue, grp, row.partition))
        if ok:
            await texts.execute_many(
                conn,
                st,
                finish,
                [{"grp": grp, "b_seq": seq, "b_result": res} for seq, res in ok.items()],
            )
    freed = await streams.refresh(st, conn, touched)
    if finished:
        await st._notify(conn, queues, done=True, task_ids=finished)
        if freed:
            await st._notify(conn, {key[0] for key in touched}, done=False)
    return left, finished, freed
