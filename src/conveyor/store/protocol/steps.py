"""The submit of plain tasks step by step on SQLite, each step a statement built
once: the parents' roots, the streams a submit's new rows joined. (The claim is
the seam's claim hook, :meth:`conveyor.store.seam.Seam._claim`; acknowledgements
are :mod:`.acks`, one path on both dialects.)"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.errors import InvalidArgument
from conveyor.store.protocol import streams, texts
from conveyor.store.protocol.requests import Request
from conveyor.store.seam import Seam

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
