"""The worker's feed: how much to claim, and the few claimed tasks waiting for a slot.

A *unit* is what one slot runs: an unpartitioned task, or a run of tasks of one
partition that must go one after another. The feed keeps

* a **prefetch buffer** of claimed units, so a freed slot starts its next
  task at once instead of waiting for a claim's round trip. It is filled only
  while handlers are quick (the mean run time under :data:`PREFETCH_BELOW`): a
  slow task's backlog is better left in the queue for idle workers. Its depth
  is what the slots get through during one claim's round trip (half the
  concurrency at least, :data:`PREFETCH_MOST` times it at most): tasks that
  take a millisecond or less would otherwise leave the slots idle while the
  next claim is on its way;
* **claims sized for batches**: a claim asks for every free slot plus the buffer,
  and waits until a quarter of that room is free unless a slot would sit idle,
  so a busy worker claims several tasks per round trip rather than one per
  finished task;
* a **cap per stream** (``claim(per_stream=)``): one claim takes the heads of
  several streams, one task each (a short run of each while tasks are quick and
  the worker holds fewer streams than slots: :meth:`Feed.per_stream`), so one
  long stream cannot fill every slot while others wait; a round claims again
  while streams keep coming and slots are left, and ends at a claim that took
  fewer tasks than it asked for: it saw every claimable one, so the worker waits
  to be woken (one of its streams let go, new work) instead of asking again;
* **back-pressure** on acknowledgements: a slot is freed when its handler
  returns, before the success is written (group commit writes it with others) —
  a stream run's too: its next task waits for that write, then for a slot;
  while acknowledgements in flight outnumber twice the slots and the buffer,
  the worker claims nothing new (the buffer counts: a stream's tasks leave
  their slot while their success is written, so a deep buffer of quick stream
  tasks keeps that many more writes going).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

PREFETCH_BELOW = 0.1  # seconds: buffer ahead only while handlers average less than this
PREFETCH_MOST = 8  # the deepest buffer, in units per slot
STREAM_RUN_MOST = 4  # the most tasks of one stream a claim takes (few streams, quick tasks)
RUN_TIME_WEIGHT = 0.2  # weight of the newest run time (and claim time) in the moving averages

H = TypeVar("H")


class Feed(Generic[H]):
    """Slot and buffer accounting for one worker (no I/O; the worker claims)."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.units: deque[list[H]] = deque()
        self.buffered = 0  # tasks in ``units``
        self.busy = 0  # slots in use
        self.acking = 0  # tasks whose handler returned and whose success is being written
        self.streams = False  # the last claim that found work returned a partition's tasks
        self.mean_run: float | None = None
        self.mean_claim: float | None = None

    @property
    def prefetch(self) -> int:
        """Units to hold beyond the slots while tasks are quick: what the slots run
        during one claim's round trip, between half the concurrency and
        :data:`PREFETCH_MOST` times it."""
        mean_run = self.mean_run
        if mean_run is None or mean_run >= PREFETCH_BELOW:
            return 0
        least = max(1, self.concurrency // 2)
        if self.mean_claim is None:
            return least
        # Every slot finishes round-trip / run-time tasks while a claim is out.
        through = self.concurrency * self.mean_claim / max(mean_run, 1e-6)
        return int(min(max(least, through), PREFETCH_MOST * self.concurrency))

    def room(self) -> int:
        """Units to claim now; 0 means wait for a slot (or for acknowledgements)."""
        if self.held_back:
            return 0
        capacity = self.concurrency + self.prefetch
        room = capacity - self.busy - len(self.units)
        if room <= 0:
            return 0
        idle = self.busy < self.concurrency and not self.units
        return room if idle or room >= max(1, capacity // 4) else 0

    @property
    def held_back(self) -> bool:
        """Whether acknowledgements are too far behind to claim more: over twice
        what the slots and the buffer hold are waiting for their success to be
        written (twice the concurrency while nothing is buffered)."""
        return self.acking > 2 * (self.concurrency + self.prefetch)

    def per_stream(self, streams_held: int) -> int:
        """Tasks of one stream per claim, given how many streams this worker holds
        now (running, buffered or being acknowledged). The head alone, unless tasks
        are quick (prefetching) and streams are few: then the next ones come along
        (they run right after the head, in the same slot, each once the one before
        is acknowledged, without a claim of their own): two, or
        :data:`STREAM_RUN_MOST` when the streams held fill at most a quarter of the
        slots. With more streams held than slots, the heads of other streams keep
        the slots busy, and a run's tasks would each wait for an acknowledgement
        that a single task lets go of at once (measured at 100 partitions: client
        CPU per task 107 µs taking one per stream, 129 µs taking two; on one
        partition, 1,156 µs taking one, 636 µs taking four)."""
        if not self.prefetch or streams_held > self.concurrency:
            return 1
        return STREAM_RUN_MOST if 4 * streams_held <= self.concurrency else 2

    def add(self, tasks: Iterable[H], partition_of: Callable[[H], str | None]) -> int:
        """Buffer a claim's tasks as units; returns how many units they made."""
        made = 0
        partitioned = False
        for partition, run in itertools.groupby(tasks, key=partition_of):
            batch = list(run)
            if partition is None:
                self.units.extend([held] for held in batch)
                made += len(batch)
            else:
                partitioned = True
                self.units.append(batch)
                made += 1
            self.buffered += len(batch)
        if made:
            self.streams = partitioned
        return made

    def take(self) -> list[H] | None:
        """The next unit to start, if a slot is free (the slot is then taken)."""
        if not self.units or self.busy >= self.concurrency:
            return None
        unit = self.units.popleft()
        self.buffered -= len(unit)
        self.busy += 1
        return unit

    def drain(self) -> list[H]:
        """Every buffered task (to hand back on stop); the buffer is emptied."""
        out = [held for unit in self.units for held in unit]
        self.units.clear()
        self.buffered = 0
        return out

    def ran(self, seconds: float) -> None:
        """A handler returned after ``seconds``."""
        if self.mean_run is None:
            self.mean_run = seconds
        else:
            self.mean_run += RUN_TIME_WEIGHT * (seconds - self.mean_run)

    def claimed(self, seconds: float) -> None:
        """A claim that found work took ``seconds`` from asking to its answer."""
        if self.mean_claim is None:
            self.mean_claim = seconds
        else:
            self.mean_claim += RUN_TIME_WEIGHT * (seconds - self.mean_claim)


__all__ = ["PREFETCH_BELOW", "PREFETCH_MOST", "Feed"]
