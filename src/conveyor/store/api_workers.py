"""The store's live-worker records, its public side (a base of TaskStore):
:meth:`WorkerOps.announce_worker` and :meth:`WorkerOps.retire_worker`, which
every :class:`~conveyor.worker.Worker` calls, and :meth:`TaskStore.workers`
reads (see :mod:`.protocol.presence`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from conveyor import _values as v
from conveyor.errors import InvalidArgument
from conveyor.store.protocol import presence
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol.presence import ANNOUNCE_TTL
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class WorkerOps(Seam):
    """Announcing and retiring workers (a base of TaskStore)."""

    async def announce_worker(
        self,
        worker_id: str,
        *,
        queues: str | Sequence[str],
        group: str | None = None,
        concurrency: int = 1,
        ttl: v.Duration = ANNOUNCE_TTL,
    ) -> None:
        """Record that the worker ``worker_id`` runs now, consuming ``queues`` (as
        ``group``, or in queue mode) ``concurrency`` tasks at a time, for ``ttl``
        seconds: :meth:`workers` lists it until then. Announce again before it
        runs out; the first announcement of an id is its start time. The host
        name and process id are this process's. Expired rows of other workers
        are deleted on the way."""
        worker_id = v.name("worker_id", worker_id)
        names = [v.name("queues", q) for q in ([queues] if isinstance(queues, str) else queues)]
        if not names:
            raise InvalidArgument("queues", "must name at least one queue")
        grp = v.opt_name("group", group) or ""
        concurrency = v.positive_int("concurrency", concurrency)
        ttl_us = round(v.duration_seconds("ttl", ttl, allow_zero=False) * v.US)

        async def work(conn: AsyncConnection) -> None:
            await presence.announce_tx(self, conn, worker_id, names, grp, concurrency, ttl_us)

        await tx.run(self, work)

    async def retire_worker(self, worker_id: str) -> None:
        """Forget the worker ``worker_id`` (it stopped): :meth:`workers` lists it
        no more, unless it still holds leases."""
        worker_id = v.name("worker_id", worker_id)

        async def work(conn: AsyncConnection) -> None:
            await presence.retire_tx(conn, worker_id)

        await tx.run(self, work)


__all__ = ["WorkerOps"]
