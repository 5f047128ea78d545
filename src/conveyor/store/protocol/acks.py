"""Acknowledgements: ``succeed`` (one task), ``succeed_many`` and ``ack_many``
(batches), each one path on every dialect, run by the catalogue's four ack
statements (and ``task_views``, which reads the tasks back).

* ``succeed_plain`` finishes one unpartitioned row;
* ``ack_plain`` finishes a batch of unpartitioned rows;
* ``ack_streams_lock`` then ``ack_streams`` finish any rows, partitioned or not:
  the first locks the streams they move (the lock order: streams before delivery
  rows), the second finishes the rows and recomputes those streams.

Which to run is chosen by what the request holds: a batch the caller knows to be
partitioned goes straight to the stream pair; otherwise the plain statement goes
first and the items it did not finish (partitioned rows, or fence failures: its
rows do not say which) go on to the pair. What still failed its fence is
explained item by item (:func:`~conveyor.store.protocol.consumer.explain_lost`).

Each item is fenced on its own, as :mod:`conveyor.store.protocol.consumer`'s single
writes are: one item's failure does not hold back the others. Waiters are told
by the statements (the dialect's announcement, or its commit) and, in this
process, by :func:`~conveyor.store.protocol.wake.wake_local` after the commit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from conveyor import _values as v
from conveyor.errors import ConveyorError, InvalidArgument, LostLease, NotFound
from conveyor.models import Task
from conveyor.store.protocol import codec, sealing, texts, wake
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol.consumer import explain_lost
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: A validated succeed_many item: (index, task_id, worker_id, grp, attempt, result JSON).
AckItem = tuple[int, str, str, str, int | None, str]

#: An item's outcome: the task (read back), ``None`` (finished, not read back) or
#: the error it met.
Outcome = Task | ConveyorError | None


def validate_acks(
    items: Iterable[Mapping[str, Any]], *, max_size: int | None = None
) -> tuple[list[Outcome], list[AckItem]]:
    """Check succeed_many's items: ``(outcomes, todo)``, where ``outcomes`` holds an
    error at the index of each item whose result is not JSON or over ``max_size``
    bytes (``None`` elsewhere) and ``todo`` the items to acknowledge. Malformed
    items raise at once."""
    outcomes: list[Outcome] = []
    todo: list[AckItem] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InvalidArgument(f"items[{i}]", "must be a dict of succeed() arguments")
        unknown = set(item) - {"task_id", "worker_id", "result", "group", "attempt"}
        if unknown:
            raise InvalidArgument(sorted(unknown)[0], "is not an argument of succeed()")
        task_id = v.name("task_id", item.get("task_id"))
        worker_id = v.name("worker_id", item.get("worker_id"))
        grp = codec.group_key(item.get("group"))
        attempt = item.get("attempt")
        if attempt is not None:
            attempt = v.positive_int("attempt", attempt)
        try:
            encoded = v.to_json("result", item.get("result"), max_size=max_size)
        except InvalidArgument as exc:
            outcomes.append(exc)
            continue
        outcomes.append(None)
        todo.append((i, task_id, worker_id, grp, attempt, encoded))
    return outcomes, todo


async def sealed(st: Seam, todo: list[AckItem]) -> list[AckItem]:
    """``todo`` with the result of each sealed task sealed (:mod:`.sealing`), and
    the tasks forgotten: their outcome is being written. A task this store did not
    claim is looked up first (one read for them all); a sealed one and no keys:
    ConfigurationError, nothing written."""
    keyring = st._keyring
    held = keyring.held
    unknown = [item[1] for item in todo if item[1] not in held and item[5] is not None]
    found = await sealing.sealed_tasks(st, unknown) if unknown else set()
    out: list[AckItem] = []
    for i, task_id, worker_id, grp, attempt, encoded in todo:
        seal = held.pop(task_id, None) or task_id in found
        if seal and encoded is not None:
            encoded = keyring.seal_for(encoded, task_id, "result")
        out.append((i, task_id, worker_id, grp, attempt, encoded))
    return out


async def succeed(
    st: Seam,
    task_id: str,
    worker_id: str,
    group: str | None,
    attempt: int | None,
    encoded: str,
) -> Task:
    """Finish a leased task as ``succeeded`` with the JSON ``encoded`` result
    (sealed if the task is held sealed: :func:`sealed`), or raise why its fence
    failed: ``succeed_plain`` (one statement) for an unpartitioned row; when that
    finishes nothing (a partitioned row, or the fence failed), the stream pair in
    one transaction with the task read back or the failure explained there."""
    encoded = (await sealed(st, [(0, task_id, worker_id, "", None, encoded)]))[0][5]
    item: AckItem = (
        0,
        v.name("task_id", task_id),
        v.name("worker_id", worker_id),
        codec.group_key(group),
        None if attempt is None else v.positive_int("attempt", attempt),
        encoded,
    )
    built = await texts.of(st)
    params = {
        "id": item[1],
        "worker_id": item[2],
        "grp": item[3],
        "attempt": item[4],
        "result": encoded,
    }
    rows = await texts.alone(st, _need(built, "succeed_plain"), params)
    if rows:
        wake.wake_local(st, work=False)
        return codec.row_to_task(rows[0], st._keyring)
    found, freed = await tx.run(st, lambda conn: finish_tx(st, conn, built, [item]))
    outcome = found[0]
    if isinstance(outcome, ConveyorError):
        raise outcome
    wake.wake_local(st, work=freed)
    assert outcome is not None
    return outcome


async def succeed_many(
    st: Seam, outcomes: list[Outcome], todo: list[AckItem]
) -> list[Task | ConveyorError]:
    """Finish the leased ``todo`` items in one transaction, the tasks read back in
    it: per item, in order, its task or the error it met (``outcomes`` holds those
    of the items refused before). Always the stream pair: the plain statement first
    in the same transaction would take delivery rows before the streams. Results
    of tasks held sealed are sealed (:func:`sealed`)."""
    todo = await sealed(st, todo)
    built = await texts.of(st)
    found, freed = await tx.run(st, lambda conn: finish_tx(st, conn, built, todo))
    if any(not isinstance(outcome, ConveyorError) for outcome in found.values()):
        wake.wake_local(st, work=freed)
    out = list(outcomes)
    for i, outcome in found.items():
        out[i] = outcome
    return [o for o in out if o is not None]


async def ack_many(
    st: Seam,
    outcomes: list[Outcome],
    todo: list[AckItem],
    *,
    partitioned: bool = False,
) -> list[ConveyorError | None]:
    """Finish the ``todo`` items without reading tasks back: per item ``None`` when
    it was acknowledged, else its error. ``ack_plain`` first (committed on its own)
    unless the caller says the batch is ``partitioned``; the items it left go
    through the stream pair (sent together), and those still left are explained
    in a read of their own. Results of tasks held sealed are sealed (:func:`sealed`)."""
    todo = await sealed(st, todo)
    built = await texts.of(st)
    left = todo
    if not partitioned:
        rows = await texts.alone(st, _need(built, "ack_plain"), {"items": _ack_items(todo)})
        left = _left(todo, rows)
        if len(left) < len(todo):
            wake.wake_local(st, work=False)
    if left:
        params = {"items": _ack_items(left)}
        steps = [(_need(built, "ack_streams_lock"), params), (_need(built, "ack_streams"), params)]
        rows = await texts.together(st, steps)
        still = _left(left, rows)
        if len(still) < len(left):
            # Waiters of finished tasks; idle workers too when a stream's head is free now.
            wake.wake_local(st, work=bool(rows[0].freed))
        left = still
    out = [o if isinstance(o, ConveyorError) else None for o in outcomes]
    if left:

        async def explain(conn: AsyncConnection) -> list[ConveyorError]:
            return [await _why(conn, item) for item in left]

        for item, error in zip(left, await tx.run(st, explain, write=False), strict=True):
            out[item[0]] = error
    return out


async def finish_tx(
    st: Seam, conn: AsyncConnection, built: texts.Texts, todo: Sequence[AckItem]
) -> tuple[dict[int, Outcome], bool]:
    """Finish ``todo`` with the stream pair inside ``conn``'s transaction: each
    item's task as it is now (by the item's index), or the error its fence met;
    and whether a stream's head became claimable (idle claimers have something
    to find)."""
    params = {"items": _ack_items(todo)}
    await texts.execute(conn, st, _need(built, "ack_streams_lock"), params)
    rows = list(await texts.execute(conn, st, _need(built, "ack_streams"), params))
    lost = _lost(rows)
    by_group: dict[str, list[str]] = {}
    for n, item in enumerate(todo, 1):
        if n not in lost:
            by_group.setdefault(item[3], []).append(item[1])
    tasks: dict[tuple[str, str], Task] = {}
    views = _need(built, "task_views")
    for grp, ids in by_group.items():
        found = await texts.execute(
            conn, st, views, {"ids": json.dumps(sorted(set(ids))), "grp": grp}
        )
        tasks.update({(grp, row.id): codec.row_to_task(row, st._keyring) for row in found})
    out: dict[int, Outcome] = {}
    for n, item in enumerate(todo, 1):
        out[item[0]] = await _why(conn, item) if n in lost else tasks.get((item[3], item[1]))
    return out, bool(rows and rows[0].freed)


async def _why(conn: AsyncConnection, item: AckItem) -> ConveyorError:
    """Why ``item``'s fence failed: NotFound, TaskCancelled or LostLease."""
    try:
        await explain_lost(conn, item[1], item[3])
    except (LostLease, NotFound) as exc:
        return exc
    raise AssertionError("explain_lost always raises")  # pragma: no cover


def _lost(rows: Sequence[Any]) -> set[int]:
    """The 1-based positions an ack statement reports as not finished."""
    return {row.idx for row in rows if row.idx is not None}


def _left(todo: list[AckItem], rows: Sequence[Any]) -> list[AckItem]:
    """The items of ``todo`` an ack statement did not finish."""
    lost = _lost(rows)
    return [item for n, item in enumerate(todo, 1) if n in lost] if lost else []


def _need(built: texts.Texts, name: str) -> texts.Text:
    """The store's statement ``name`` (every dialect has each ack statement: the
    catalogue test holds them to it)."""
    text = built.get(name)
    assert text is not None, f"the dialect lacks the catalogue statement {name}"
    return text


def _ack_items(todo: Sequence[AckItem]) -> str:
    """The ``items`` parameter of the ack statements, the same JSON text on every
    dialect: one array of ``[id, worker_id, grp, attempt, result]`` (the result as
    its JSON text)."""
    return json.dumps([item[1:] for item in todo], ensure_ascii=False, separators=(",", ":"))


__all__ = [
    "AckItem",
    "Outcome",
    "ack_many",
    "finish_tx",
    "succeed",
    "succeed_many",
    "validate_acks",
]
