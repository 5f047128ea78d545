"""Submit requests: each validated into a :class:`Request` (:func:`prepare`), and
a batch's validated as they are taken (:class:`Preparing`), before anything is
written.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sized
from dataclasses import dataclass
from typing import Any

from conveyor import _values as v
from conveyor.errors import InvalidArgument
from conveyor.models import Task

CONFLICTS = ("reuse", "reject", "replace")
SUBMIT_FIELDS = frozenset(
    {
        "name",
        "payload",
        "queue",
        "priority",
        "delay",
        "run_at",
        "max_attempts",
        "key",
        "conflict",
        "partition",
        "parent",
        "correlation_id",
        "metadata",
        "backoff",
        "after",
        "on_parent_failure",
        "batch",
        "concurrency_key",
    }
)
ON_PARENT_FAILURE = ("cancel", "run")


@dataclass(slots=True)
class Request:
    """A validated submit request."""

    id: str
    name: str
    payload: str
    queue: str
    priority: int
    delay_us: int | None
    run_at_us: int | None
    max_attempts: int | None
    backoff: str | None
    key: str | None
    conflict: str
    partition: str | None
    parent_id: str | None
    correlation_id: str | None
    metadata: str
    #: The key the payload and metadata are sealed with (None: as given, plain);
    #: set by the step-by-step submit of an encrypted queue's task.
    key_id: str | None = None
    #: Seal it whatever its queue's setting (a dead letter of a sealed task).
    seal: bool = False
    #: The ids of the tasks it waits for (``after=``), none repeated; None: none.
    after: tuple[str, ...] | None = None
    #: ``on_parent_failure="run"``: queued once every parent is terminal, however
    #: it ended (else cancelled when one fails).
    run_on_failure: bool = False
    #: The batch it belongs to (``batch=``), by id.
    batch_id: str | None = None

    @property
    def linked(self) -> bool:
        """Whether it waits for parents or belongs to a batch (see
        :mod:`conveyor.store.protocol.dependencies`)."""
        return self.after is not None or self.batch_id is not None

    #: The task's flow-control key (:mod:`conveyor.store.protocol.limits`); a
    #: request with one goes step by step (``insert_rows``).
    concurrency_key: str | None = None


def prepare(req: Mapping[str, Any], *, max_size: int | None = None) -> Request:
    """Validate one submit request (a mapping of submit()'s arguments); payload and
    metadata may take at most ``max_size`` bytes of JSON each."""
    # Options left at their default skip their checks (per-task cost of submit_many).
    unknown = set(req) - SUBMIT_FIELDS
    if unknown:
        raise InvalidArgument(sorted(unknown)[0], "is not an argument of submit()")
    if "name" not in req:
        raise InvalidArgument("name", "is required")
    get = req.get
    name = v.name("name", req["name"])
    queue = v.name("queue", get("queue", "default"))
    payload = v.to_json("payload", get("payload"), max_size=max_size)
    priority = get("priority", 0)
    if priority.__class__ is not int or not -(2**31) <= priority < 2**31:
        priority = v.integer("priority", priority)
    delay, run_at = get("delay"), get("run_at")
    delay_us = run_at_us = None
    if delay is not None or run_at is not None:
        if delay is not None and run_at is not None:
            raise InvalidArgument("delay", "give delay or run_at, not both")
        if delay is not None:
            delay_us = round(v.duration_seconds("delay", delay) * v.US)
        else:
            run_at_us = v.to_us(v.aware("run_at", run_at))
    max_attempts = get("max_attempts")
    if max_attempts is not None:
        max_attempts = v.positive_int("max_attempts", max_attempts)
    backoff = get("backoff")
    if backoff is not None:
        backoff = json.dumps(v.backoff("backoff", backoff).as_dict())  # type: ignore[union-attr]
    key = get("key")
    if key is not None:
        key = v.name("key", key)
    conflict = get("conflict", "reuse")
    if conflict not in CONFLICTS:
        raise InvalidArgument(
            "conflict", f"must be one of {', '.join(CONFLICTS)}, got {conflict!r}"
        )
    partition = get("partition")
    if partition is not None:
        partition = v.name("partition", partition)
    parent = get("parent")
    if parent is not None:
        if isinstance(parent, Task):
            parent = parent.id
        parent = v.name("parent", parent)
    correlation_id = get("correlation_id")
    if correlation_id is not None:
        correlation_id = v.name("correlation_id", correlation_id)
    meta = get("metadata")
    after = get("after")
    on_failure = get("on_parent_failure", "cancel")
    batch = get("batch")
    if after is not None or on_failure != "cancel" or batch is not None:
        after, batch = _links(after, on_failure, batch, partition)
    concurrency_key = get("concurrency_key")
    if concurrency_key is not None:
        concurrency_key = v.name("concurrency_key", concurrency_key)
        if partition is not None:
            # A partition already orders its tasks one at a time; its streams are
            # claimed whole, never counted per key.
            raise InvalidArgument(
                "concurrency_key", "cannot be given with a partition: choose one of the two"
            )
    return Request(
        id=v.new_task_id(),
        name=name,
        payload=payload,
        queue=queue,
        priority=priority,
        delay_us=delay_us,
        run_at_us=run_at_us,
        max_attempts=max_attempts,
        backoff=backoff,
        key=key,
        conflict=conflict,
        partition=partition,
        parent_id=parent,
        correlation_id=correlation_id,
        metadata="{}" if meta is None else v.metadata(meta, max_size=max_size),
        after=after,
        run_on_failure=on_failure == "run",
        batch_id=batch,
        concurrency_key=concurrency_key,
    )


def _links(
    after: Any, on_failure: Any, batch: Any, partition: str | None
) -> tuple[tuple[str, ...] | None, str | None]:
    """``after`` as a tuple of task ids (None for none) and the batch's id, checked."""
    if on_failure not in ON_PARENT_FAILURE:
        raise InvalidArgument(
            "on_parent_failure", f"must be one of cancel, run, got {on_failure!r}"
        )
    ids: tuple[str, ...] | None = None
    if after is not None:
        if isinstance(after, (str, Task)) or not isinstance(after, Iterable):
            raise InvalidArgument("after", "must be a list of tasks or task ids")
        seen: dict[str, None] = {}
        for i, parent in enumerate(after):
            if isinstance(parent, Task):
                parent = parent.id
            seen[v.name(f"after[{i}]", parent)] = None
        ids = tuple(seen) or None
    if batch is not None:
        batch = v.name("batch", getattr(batch, "id", batch))
    if partition is not None and (ids is not None or batch is not None):
        # A partition's order and a parent's both decide when a task may run; a
        # waiting task would hold its stream's head. Refused rather than guessed.
        raise InvalidArgument(
            "after" if ids is not None else "batch",
            "cannot be combined with partition (a waiting task would block its stream)",
        )
    return ids, batch


class Preparing:
    """submit_many()'s requests, validated as they are taken (:func:`prepare`), the
    taken ones kept in order in ``done``: a large batch may go to the database in
    runs while the rest is still being validated (:mod:`conveyor.store.protocol.submit_runs`)."""

    def __init__(self, requests: Iterable[Mapping[str, Any]], max_size: int | None) -> None:
        self.done: list[Request] = []
        try:
            if not isinstance(requests, Sized):
                # Read whole first: no caller code runs inside the transaction.
                requests = list(requests)
            self._source = iter(requests)
        except TypeError:
            raise InvalidArgument(
                "requests", f"must be a list of request dicts, got {requests!r}"
            ) from None
        #: How many requests there are.
        self.total = len(requests)
        self._max_size = max_size

    def take(self, n: int) -> list[Request]:
        """Validate up to ``n`` more requests; those validated (none: all taken)."""
        out = []
        done, max_size = self.done, self._max_size
        for req in itertools.islice(self._source, n):
            # (a dict first: the Mapping check goes through the ABC machinery)
            if req.__class__ is not dict and not isinstance(req, Mapping):
                raise InvalidArgument(
                    f"requests[{len(done)}]", "must be a dict of submit() arguments"
                )
            one = prepare(req, max_size=max_size)
            done.append(one)
            out.append(one)
        return out

    def rest(self) -> list[Request]:
        """Validate every request not taken yet; all of them, in order."""
        while self.take(1000):
            pass
        return self.done
