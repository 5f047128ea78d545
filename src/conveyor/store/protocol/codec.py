"""Codec: database rows to :class:`~conveyor.models.Task` and back, group names to
delivery keys, list cursors, and the reads that return tasks by id or sequence.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, select, union_all

from conveyor import _values as v
from conveyor.encryption import MARK
from conveyor.errors import InvalidArgument
from conveyor.models import ConsumerGroup, Status, Task
from conveyor.schema import deliveries as d
from conveyor.schema import tasks as t
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import sealing

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


def _slot_maker(cls: type, **fixed: Any) -> Callable[..., Any]:
    """A constructor of the frozen, slotted dataclass ``cls`` that fills its slots
    directly, taking the fields as keywords; the fields in ``fixed`` are not
    arguments but always those values.

    Why: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__`` (frozen forbids plain assignment), about twice what
    writing the slot through its descriptor costs; with 26 fields that was a third
    of turning a claimed row into a Task. Only for classes without
    ``__post_init__`` (there is nothing to skip), built once, from the fields
    themselves, so it never misses one; a test compares it with ``cls(...)``."""
    assert not hasattr(cls, "__post_init__")
    fields = [f.name for f in dataclasses.fields(cls)]
    assert set(fixed) <= set(fields)
    given = [name for name in fields if name not in fixed]
    space: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def make(*, {', '.join(given)}):", "    o = _new(_cls)"]
    for i, name in enumerate(fields):
        space[f"_set{i}"] = getattr(cls, name).__set__
        if name in fixed:
            space[f"_fixed{i}"] = fixed[name]
            lines.append(f"    _set{i}(o, _fixed{i})")
        else:
            lines.append(f"    _set{i}(o, {name})")
    lines.append("    return o")
    exec("\n".join(lines), space)
    maker: Callable[..., Any] = space["make"]
    return maker


make_task: Callable[..., Task] = _slot_maker(Task)

#: Stored microseconds to datetimes, remembered: the rows of one claim share their
#: lease start and expiry, and a batch's tasks their submit moment, so most
#: conversions repeat (datetimes are immutable, so sharing one is safe).
_from_us: Callable[[int], datetime] = functools.lru_cache(maxsize=4096)(v.from_us)


def row_to_task(row: Any, keyring: sealing.Keyring | None = None) -> Task:
    """A row of :func:`conveyor.store.protocol.queries.view_columns` as a Task (a SQLAlchemy row
    or a built-once text's row: both answer to the column names as attributes).
    Sealed values are opened with ``keyring`` (:mod:`.sealing`; None: no keys, so a
    sealed value raises DecryptionError)."""
    # On every claimed task: attribute reads, no mapping built, a lookup table for
    # the status, remembered datetimes and the slot-filling constructor.
    from_us = _from_us
    metadata = row.metadata
    result = row.result
    error = row.error
    payload = row.payload
    if payload[0] == "~":  # sealed (no JSON text starts so): opened, each value
        payload, metadata, result, error = _open_row(row, keyring)
    else:
        try:
            payload = json.loads(payload)
            metadata = {} if metadata == "{}" else json.loads(metadata)
            result = None if result is None else json.loads(result)
            error = None if error is None else json.loads(error)
        except ValueError:
            # A plain payload beside a sealed value (a task stored before its queue
            # was encrypted, its result written after): not JSON, opened here.
            payload, metadata, result, error = _open_row(row, keyring)
    progress_message = row.progress_message
    if progress_message is not None and progress_message.startswith(MARK):
        progress_message = sealing.open_text(keyring, progress_message, row.id, "progress")
    started_at = row.started_at
    finished_at = row.finished_at
    lease_expires_at = row.lease_expires_at
    return make_task(
        id=row.id,
        name=row.name,
        queue=row.queue,
        partition=row.partition,
        payload=payload,
        metadata=metadata,
        priority=row.priority,
        status=_STATUS[row.status],
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        run_at=from_us(int(row.run_at)),
        created_at=from_us(int(row.created_at)),
        started_at=None if started_at is None else from_us(started_at),
        finished_at=None if finished_at is None else from_us(finished_at),
        lease_expires_at=None if lease_expires_at is None else from_us(lease_expires_at),
        worker_id=row.worker_id,
        progress=row.progress,
        progress_message=progress_message,
        result=result,
        error=error,
        key=row.key,
        parent_id=row.parent_id,
        root_id=row.root_id,
        correlation_id=row.correlation_id,
        group=row.grp or None,
        lease=row.lease,
    )


_STATUS = {status.value: status for status in Status}


def _open_row(row: Any, keyring: sealing.Keyring | None) -> tuple[Any, Any, Any, Any]:
    """The payload, metadata, result and error of a row some of whose values are
    sealed (each opened, or read as JSON)."""
    task_id = row.id
    load = sealing.load
    return (
        load(keyring, row.payload, task_id, "payload"),
        load(keyring, row.metadata, task_id, "metadata"),
        None if row.result is None else load(keyring, row.result, task_id, "result"),
        None if row.error is None else load(keyring, row.error, task_id, "error"),
    )


def new_task(row: dict[str, Any], *, payload: Any, metadata: Any) -> Task:
    """The Task a freshly inserted row (the INSERT's parameters) stands for, without
    reading it back: queued, attempt 0, nothing run yet."""
    return queued_task(
        id=row["id"],
        name=row["name"],
        queue=row["queue"],
        partition=row["partition"],
        payload=payload,
        metadata=metadata,
        priority=row["priority"],
        max_attempts=row["max_attempts"],
        run_at=v.from_us(row["run_at"]),
        created_at=v.from_us(row["created_at"]),
        key=row["key"],
        parent_id=row["parent_id"],
        root_id=row["root_id"],
        correlation_id=row["correlation_id"],
    )


#: A task just submitted, from its values: queued, attempt 0, nothing run yet (the
#: slot-filling constructor with those fields fixed: a batch submit builds one Task
#: per request, and passing 26 keywords through a wrapper cost as much as the slots).
queued_task: Callable[..., Task] = _slot_maker(
    Task,
    status=Status.QUEUED,
    attempt=0,
    started_at=None,
    finished_at=None,
    lease_expires_at=None,
    worker_id=None,
    progress=None,
    progress_message=None,
    result=None,
    error=None,
    group=None,
    lease=None,
)


# The slots' own setters (what the slot-filling constructor writes through).
_set_max_attempts = getattr(Task, "max_attempts").__set__  # noqa: B009
_set_created_at = getattr(Task, "created_at").__set__  # noqa: B009
_set_run_at = getattr(Task, "run_at").__set__  # noqa: B009
_set_root_id = getattr(Task, "root_id").__set__  # noqa: B009


def settle_queued(task: Task, max_attempts: int, created_at: datetime, run_at: datetime) -> None:
    """Fill in what the database decided for a task :data:`queued_task` built
    before the database answered (its slots, as the constructor fills them: the
    task has not been handed to anyone yet)."""
    _set_max_attempts(task, max_attempts)
    _set_created_at(task, created_at)
    _set_run_at(task, run_at)


def settle_root(task: Task, root_id: str) -> None:
    """Fill in the root the database found for a child task :data:`queued_task`
    built before it answered (its parent's root)."""
    _set_root_id(task, root_id)


def group_row(row: Any) -> ConsumerGroup:
    """A ``conveyor_groups`` row as a ConsumerGroup."""
    return ConsumerGroup(
        queue=row.queue,
        name=row.name,
        start=v.from_us(row.start_at),
        created_at=v.from_us(row.created_at),
        active=bool(row.active),
    )


def group_key(group: str | None) -> str:
    """The delivery ``grp`` of a group name (``None``: queue mode)."""
    checked = v.opt_name("group", group)
    return checked or q.QUEUE_MODE


def encode_cursor(seq: int, order: str = "oldest") -> str:
    """An opaque list() cursor for the position after ``seq`` in ``order``
    (a newest-first cursor says so; an oldest-first one is as it always was)."""
    data: dict[str, Any] = {"s": seq} if order == "oldest" else {"s": seq, "o": order}
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, order: str = "oldest") -> int:
    """The sequence number in a list() cursor made for ``order``, or InvalidArgument."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
        seq, made_for = data["s"], data.get("o", "oldest")
        if not isinstance(seq, int):
            raise TypeError
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InvalidArgument("cursor", "is not a cursor returned by list()") from None
    if made_for != order:
        raise InvalidArgument(
            "cursor", f"was returned by list(order={made_for!r}): pass the same order with it"
        )
    return seq


def list_statement(
    grp: str,
    status: Status | str | None,
    filters: dict[str, str | None],
    cursor: str | None,
    limit: int,
    *,
    order: str = "oldest",
) -> Select[Any]:
    """list()'s query: ``grp``'s view, filtered by status and the given task columns
    (validated here), after ``cursor``, in submit order (``order="newest"``: the
    reverse), ``limit`` rows."""
    stmt = q.task_view(grp)
    if status is not None:
        try:
            # Inline, not bound: Postgres matches it to the partial status index
            # only when it can read the value (see schema.py).
            stmt = stmt.where(q.is_status(Status(status).value))
        except ValueError:
            raise InvalidArgument(
                "status", f"must be one of {', '.join(s.value for s in Status)}"
            ) from None
    root = None
    for field, value in filters.items():
        if value is not None:
            if field == "root_id":
                root = v.name(field, value)
            else:
                stmt = stmt.where(t.c[field] == v.name(field, value))
    if filters.get("queue") is not None:
        stmt = stmt.where(d.c.queue == filters["queue"])  # lets the status index serve it
    newest = order == "newest"
    if cursor is not None:
        position = decode_cursor(cursor, order)
        stmt = stmt.where(t.c.seq < position if newest else t.c.seq > position)
    if root is None:
        return stmt.order_by(t.c.seq.desc() if newest else t.c.seq).limit(limit)
    # A workflow: its descendants from the root index (which holds only tasks with a
    # parent, see schema.py), the first ``limit`` of them in submit order, so a
    # page reads a page whatever the planner thinks of the table; and its root, by
    # id. The two merged in submit order.
    below = (
        stmt.where(t.c.root_id == root, t.c.parent_id.is_not(None))
        .order_by(t.c.seq.desc() if newest else t.c.seq)
        .limit(limit)
        .subquery()
    )
    itself = stmt.where(t.c.id == root, t.c.root_id == root, t.c.parent_id.is_(None))
    both = union_all(select(below), itself).subquery()
    return select(both).order_by(both.c.seq.desc() if newest else both.c.seq).limit(limit)


async def fetch_tasks(
    conn: AsyncConnection,
    grp: str,
    *,
    ids: Sequence[str] | None = None,
    seqs: Sequence[int] | None = None,
    keyring: sealing.Keyring | None = None,
) -> dict[Any, Task]:
    """The tasks with the given ids (keyed by id) or sequence numbers (keyed by seq),
    as ``grp`` sees them; unknown ones are left out. Sealed values are opened with
    ``keyring``."""
    stmt = q.task_view(grp)
    if ids is not None:
        wanted = sorted(set(ids))
        # The delivery side by its primary key too: the plan must not depend on
        # the planner's row estimates (a fresh table has none).
        stmt = stmt.where(
            t.c.id.in_(wanted), d.c.task_seq.in_(select(t.c.seq).where(t.c.id.in_(wanted)))
        )
        keyf = "id"
    else:
        assert seqs is not None
        # Both sides, so the planner can drive the join from either primary key.
        stmt = stmt.where(t.c.seq.in_(seqs), d.c.task_seq.in_(seqs))
        keyf = "seq"
    rows = await conn.execute(stmt)
    return {row._mapping[keyf]: row_to_task(row, keyring) for row in rows}
