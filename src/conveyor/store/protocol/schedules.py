"""The registry of periodic schedules (``conveyor_schedules``): the statements
the scheduler of :mod:`conveyor.schedule` runs, behind the store's internal
methods (:class:`conveyor.store.api_internal.Internal`).

The scheduler decides which ticks are due; this module only reads and writes
the registry rows, on the store's clock, in the one transaction per step the
scheduler asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import or_, select, update

from conveyor import _values as v
from conveyor.schema import schedules as sched_table
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True)
class ScheduleInfo:
    """A registry row, as ``conveyor schedules`` shows it."""

    name: str
    task: str
    queue: str
    spec: str
    catch_up: str
    last_tick: datetime | None
    last_task_id: str | None
    next_tick: datetime | None
    handled_until: datetime | None
    created_at: datetime
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601)."""
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            out[key] = value.isoformat() if isinstance(value, datetime) else value
        return out


@dataclass(frozen=True)
class Registration:
    """What a scheduler says about one of its schedules when it registers it."""

    name: str
    task: str
    queue: str
    spec: str
    catch_up: str
    next_tick: datetime | None


@dataclass(frozen=True)
class Handled:
    """One schedule's progress after a pass: every tick up to ``handled_until`` is
    done with; ``last_tick`` (and its task) is the latest one submitted, if any."""

    name: str
    handled_until: datetime
    next_tick: datetime | None
    last_tick: datetime | None = None
    last_task_id: str | None = None


def _us(moment: datetime | None) -> int | None:
    return None if moment is None else v.to_us(moment)


def _info(row: Any) -> ScheduleInfo:
    return ScheduleInfo(
        name=row.name,
        task=row.task,
        queue=row.queue,
        spec=row.spec,
        catch_up=row.catch_up,
        last_tick=v.from_us(row.last_tick),
        last_task_id=row.last_task_id,
        next_tick=v.from_us(row.next_tick),
        handled_until=v.from_us(row.handled_until),
        created_at=v.from_us(row.created_at),
        updated_at=v.from_us(row.updated_at),
    )


async def list_all(st: Seam) -> list[ScheduleInfo]:
    """Every registered schedule, by name."""

    async def work(conn: AsyncConnection) -> list[ScheduleInfo]:
        rows = await conn.execute(select(sched_table).order_by(sched_table.c.name))
        return [_info(row) for row in rows]

    return await tx.run(st, work, write=False)


async def _register(
    st: Seam, conn: AsyncConnection, items: Sequence[Registration], now_us: int
) -> None:
    """Insert the schedules not yet known; refresh what the others say about themselves
    (their progress columns stay as they are)."""
    for item in items:
        upsert = st._upsert(sched_table).values(
            name=item.name,
            task=item.task,
            queue=item.queue,
            spec=item.spec,
            catch_up=item.catch_up,
            next_tick=_us(item.next_tick),
            created_at=now_us,
            updated_at=now_us,
        )
        upsert = upsert.on_conflict_do_update(
            index_elements=["name"],
            set_={
                "task": upsert.excluded.task,
                "queue": upsert.excluded.queue,
                "spec": upsert.excluded.spec,
                "catch_up": upsert.excluded.catch_up,
            },
        )
        await conn.execute(upsert)


async def read(
    st: Seam,
    names: Sequence[str],
    now: datetime | None,
    register: Callable[[datetime], Sequence[Registration]] | None,
) -> tuple[datetime, dict[str, ScheduleInfo]]:
    """``(moment, rows of names)`` in one transaction: ``moment`` is ``now``, or the
    store's clock read in it; with ``register``, the registrations it returns for
    that moment are written first (then the transaction is a write)."""

    async def work(conn: AsyncConnection) -> tuple[datetime, dict[str, ScheduleInfo]]:
        moment = now if now is not None else v.from_us(await tx.now_us(st, conn))
        if register is not None:
            await _register(st, conn, register(moment), v.to_us(moment))
        rows = await conn.execute(select(sched_table).where(sched_table.c.name.in_(names)))
        return moment, {row.name: _info(row) for row in rows}

    return await tx.run(st, work, write=register is not None)


async def record(st: Seam, marks: Sequence[Handled]) -> None:
    """Write each schedule's progress in one transaction, stamped with the store's
    clock. Monotone: a row already handled up to a later tick (a faster scheduler's
    pass) is left as it is, so a slower scheduler never moves a schedule backwards."""

    async def work(conn: AsyncConnection) -> None:
        updated = await tx.now_us(st, conn)
        for mark in marks:
            handled = v.to_us(mark.handled_until)
            values: dict[str, Any] = {
                "handled_until": handled,
                "next_tick": _us(mark.next_tick),
                "updated_at": updated,
            }
            if mark.last_tick is not None:
                values["last_tick"] = v.to_us(mark.last_tick)
                values["last_task_id"] = mark.last_task_id
            await conn.execute(
                update(sched_table)
                .where(
                    sched_table.c.name == mark.name,
                    or_(
                        sched_table.c.handled_until.is_(None),
                        sched_table.c.handled_until < handled,
                    ),
                )
                .values(**values)
            )

    await tx.run(st, work)


__all__ = ["Handled", "Registration", "ScheduleInfo", "list_all", "read", "record"]
