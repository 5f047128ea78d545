"""The worker: claims tasks of an :class:`~conveyor.app.App`, runs their handlers and
records the outcomes (:mod:`.loop`); its feed, heartbeats, group commit, recording,
handler context, logging, start-up (the database, its group: :mod:`.startup`),
tasks it has no handler for (:mod:`.unknown`) and the supervisor of worker
processes."""

from conveyor.worker.context import Context
from conveyor.worker.loop import Worker

__all__ = ["Context", "Worker"]
