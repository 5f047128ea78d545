"""The roll-up of finished rows into the throughput and totals tables that the
dashboard and metrics read (:mod:`conveyor.store.api_reads`): run by the store's
roll-up in ``maintain()`` (:mod:`.upkeep`) for each batch of finished rows it
folds, and by retention for rows it deletes before they were folded."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select

from conveyor import _values as v
from conveyor.schema import tasks as t
from conveyor.schema import throughput as tp
from conveyor.schema import totals as tt
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

MINUTE_US = 60 * v.US
#: Minutes of per-minute throughput kept (older buckets are pruned by the roll-up).
THROUGHPUT_KEEP_MINUTES = 24 * 60


async def fold_observed(
    st: Seam, conn: AsyncConnection, rows: Iterable[tuple[int, str, str, str, int | None]]
) -> None:
    """Add finished rows — ``(task_seq, queue, grp, status, finished_at)`` — to the
    throughput and totals tables, inside the caller's transaction (the roll-up's,
    or retention's for rows it deletes before they were rolled up)."""
    rows = builtins.list(rows)
    if not rows:
        return
    seqs = sorted({row[0] for row in rows})
    names = {
        seq: name
        for seq, name in await conn.execute(select(t.c.seq, t.c.name).where(t.c.seq.in_(seqs)))
    }
    per_minute: dict[tuple[str, str, int, str], int] = {}
    per_name: dict[tuple[str, str, str, str], int] = {}
    for seq, queue, grp, status, finished_at in rows:
        if finished_at is not None:
            key = (queue, grp, int(finished_at) // MINUTE_US, status)
            per_minute[key] = per_minute.get(key, 0) + 1
        if seq in names:
            nkey = (queue, grp, names[seq], status)
            per_name[nkey] = per_name.get(nkey, 0) + 1
    await _add(st, conn, tp, ["queue", "grp", "minute", "status"], per_minute)
    await _add(st, conn, tt, ["queue", "grp", "name", "status"], per_name)


async def _add(
    st: Seam, conn: AsyncConnection, table: Any, keys: builtins.list[str], deltas: Mapping[Any, int]
) -> None:
    # Sorted: one lock order for concurrent roll-ups.
    for key, n in sorted(deltas.items()):
        ins = st._upsert(table).values(**dict(zip(keys, key, strict=True)), n=n)
        await conn.execute(
            ins.on_conflict_do_update(index_elements=keys, set_={"n": table.c.n + n})
        )


async def prune_observed(st: Seam, conn: AsyncConnection) -> None:
    """Drop throughput minutes older than :data:`THROUGHPUT_KEEP_MINUTES`."""
    now = await tx.now_us(st, conn)
    oldest = now // MINUTE_US - THROUGHPUT_KEEP_MINUTES
    await conn.execute(delete(tp).where(tp.c.minute < oldest))
