"""A worker's share of the store's maintenance: a pass beside its first claims,
then one every ``maintain_interval``, the fleet's passes spread over it (the
store lets one caller at a time do the work)."""

from __future__ import annotations

import asyncio
import logging
import random

from conveyor.errors import ConveyorError
from conveyor.store.base import TaskStore
from conveyor.worker.heartbeats import Heartbeats

log = logging.getLogger("conveyor.worker")


async def maintain_every(interval: float, store: TaskStore, heartbeats: Heartbeats) -> None:
    """Maintain ``store`` at start, then every ``interval`` seconds, until cancelled."""
    # A pass at start, beside the first claims: a queue filled before its
    # workers started gets its table statistics now (on Postgres, where
    # autovacuum has not analysed the new rows yet or is off, the batch
    # acknowledgement costs about twice the server time without them), and
    # expired leases (a crashed worker's) are recovered at once. The
    # store lets one caller at a time do the work: in a fleet started together
    # the first worker does it and the others skip. Retention and the roll-up
    # of finished rows wait for the next pass: beside a backlog they ran
    # inside the drain (0.34 s of server time in a 20,000-task drain).
    await maintain_once(store, heartbeats, start=True)
    # Then spread the fleet's passes over the interval.
    await asyncio.sleep(random.uniform(0.0, interval))
    while True:
        await maintain_once(store, heartbeats)
        await asyncio.sleep(interval)


async def maintain_once(store: TaskStore, heartbeats: Heartbeats, *, start: bool = False) -> None:
    """One pass (with ``start``, the lighter one of a worker's start: no retention,
    no roll-up); a failure is logged, never raised. Then the heartbeats learn the
    queues' configured leases again, so a changed setting is picked up."""
    try:
        maintain = store.internal.maintain_at_start if start else store.maintain
        counts = await maintain()
        if any(counts.get(k) for k in ("recovered", "expired", "evicted", "deleted")):
            log.info("maintenance: %s", counts)
    except (ConveyorError, OSError) as exc:
        log.warning("maintenance failed: %s", exc)
    await heartbeats.refresh()


__all__ = ["maintain_every", "maintain_once"]
