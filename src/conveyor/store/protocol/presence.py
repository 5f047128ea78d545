"""Live workers: each running worker announces itself, so a dashboard (and
``conveyor workers``) shows it whether it holds leases or waits for work.

A worker announces itself when it starts and again every :data:`ANNOUNCE_EVERY`
seconds (:func:`announce_tx`), and retires when it stops (:func:`retire_tx`).
An announcement is live for its ``ttl``; the row of a worker killed without
stopping stops counting then, and the next announcement of any worker deletes
it. One small table (``conveyor_workers``), a row per running worker, written
every few seconds: a cold path, so its statements are written once here in
SQLAlchemy Core (as :mod:`.queries` are) rather than in the dialects' files.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select

from conveyor import _values as v
from conveyor.schema import workers as w
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: Seconds between a worker's announcements.
ANNOUNCE_EVERY = 10.0
#: Seconds an announcement stays live: three announcements may be missed (a
#: database restart, a long pause) before a running worker looks gone.
ANNOUNCE_TTL = 3 * ANNOUNCE_EVERY


@dataclass(frozen=True, slots=True)
class Announced:
    """One live worker's row, as read (times as datetimes)."""

    worker_id: str
    queues: list[str]
    group: str | None
    concurrency: int
    host: str
    pid: int
    started_at: datetime
    seen_at: datetime


async def announce_tx(
    st: Seam,
    conn: AsyncConnection,
    worker_id: str,
    queues: Sequence[str],
    grp: str,
    concurrency: int,
    ttl_us: int,
) -> None:
    """Write (or refresh) the row of ``worker_id`` (arguments validated), live for
    ``ttl_us`` from now; the first write of an id is its start time. Deletes the
    expired rows of other workers."""
    now = await tx.now_us(st, conn)
    await conn.execute(delete(w).where(w.c.expires_at < now, w.c.worker_id != worker_id))
    fields: dict[str, Any] = {
        "queues": json.dumps(list(queues)),
        "grp": grp,
        "concurrency": concurrency,
        "host": socket.gethostname()[:255] or "?",
        "pid": os.getpid(),
        "seen_at": now,
        "expires_at": now + ttl_us,
    }
    ins = st._upsert(w).values(worker_id=worker_id, started_at=now, **fields)
    await conn.execute(ins.on_conflict_do_update(index_elements=["worker_id"], set_=fields))


async def retire_tx(conn: AsyncConnection, worker_id: str) -> None:
    """Delete the row of ``worker_id``."""
    await conn.execute(delete(w).where(w.c.worker_id == worker_id))


async def live_workers(st: Seam, conn: AsyncConnection) -> list[Announced]:
    """The workers whose announcement has not expired, in ``conn``'s transaction."""
    now = await tx.now_us(st, conn)
    rows = await conn.execute(select(w).where(w.c.expires_at >= now))
    return [
        Announced(
            worker_id=row.worker_id,
            queues=list(json.loads(row.queues)),
            group=row.grp or None,
            concurrency=int(row.concurrency),
            host=row.host,
            pid=int(row.pid),
            started_at=v.from_us(int(row.started_at)),
            seen_at=v.from_us(int(row.seen_at)),
        )
        for row in rows
    ]


__all__ = [
    "ANNOUNCE_EVERY",
    "ANNOUNCE_TTL",
    "Announced",
    "announce_tx",
    "live_workers",
    "retire_tx",
]
