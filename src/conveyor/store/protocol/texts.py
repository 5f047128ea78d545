"""Statements built once: the hot statements as driver text, compiled per dialect
when the store opens, and run without rebuilding anything per call.

Building a SQLAlchemy Core statement, cache-keying and compiling it costs more
client time than the database spends running it. So each hot statement is
named here, built once per store at ``open()``, and kept as driver text with
named bind parameters (lists go in as arrays, never as growing ``IN`` lists).

Where a statement comes from: the dialect's SQL files (``sql/*.sql`` in the
dialect's package, one ``-- name:`` block per statement, written with ``:name``
bind parameters), read once per process by :func:`load` and turned into the
driver's parameter style at open() (:func:`build`). The statements and their
contracts are listed in :mod:`conveyor.store.catalogue`.

A block may be a *script*: several statements, each ended by a ``;`` at the end
of a line, run in order in one transaction with the same parameters; the rows
are the last one's (:attr:`Text.before` holds the earlier ones). A dialect that
cannot say in one statement what another does (SQLite has no data-modifying
CTEs) meets the same contract so.

Running:

* :func:`alone` — one statement by itself, committed on its own (autocommit where
  the dialect allows), with the store's retries; on Postgres it runs on a
  driver connection kept in autocommit (:mod:`.pg_direct`), skipping SQLAlchemy's
  execution layer and pool (a script runs as :func:`together` runs steps);
* :func:`execute` — one statement inside a transaction the caller runs
  (:func:`conveyor.store.protocol.transactions.run`).

Both bind ``offset_us`` (the store's ``clock_offset`` in microseconds) for
statements whose clock reads it (see :func:`now`). Rows come back as tuples with
attribute access by column name.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, bindparam
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor import _values as v
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

#: The bind parameter the clock of a built-once statement reads.
OFFSET = "offset_us"
#: The bind parameter a process clock is read into (see :func:`now`).
CLOCK = "now_us"
#: The suffix of a statement's variant for a caller's transaction
#: (``submit(..., connection=...)``), where the dialect has one: see
#: :meth:`Texts.in_callers`.
IN_CALLERS = "_in"


def now(st: Seam) -> ColumnElement[int]:
    """The store's clock for a built-once Core statement: the dialect's clock plus
    the ``offset_us`` bind parameter (bound by the runners); where the clock is the
    process's (``st.process_clock``), the ``now_us`` bind parameter, the clock read
    (offset included) each time the statement runs."""
    if st.process_clock:
        return bindparam(CLOCK, type_=BigInteger)
    return st._db_now() + bindparam(OFFSET, type_=BigInteger)


@dataclass(frozen=True, slots=True)
class Text:
    """One statement as driver text (a script: the last of its statements)."""

    name: str
    sql: str
    #: Values of parameters fixed at build time (Core literals); merged under the
    #: caller's.
    fixed: Mapping[str, Any] = field(default_factory=dict)
    #: Whether the text reads ``offset_us``.
    clock: bool = False
    #: Whether the text reads ``now_us`` (a process clock, read per run).
    now: bool = False
    #: A script's statements before :attr:`sql`, run first with the same parameters.
    before: tuple[str, ...] = ()

    def statements(self) -> tuple[str, ...]:
        """Every statement of the text, in order (one unless it is a script)."""
        return (*self.before, self.sql)

    def bind(self, st: Seam, params: Mapping[str, Any]) -> dict[str, Any]:
        """The driver parameters for one run."""
        out = {**self.fixed, **params} if self.fixed else dict(params)
        if self.clock:
            out[OFFSET] = round(st.clock_offset * v.US)
        if self.now:
            out[CLOCK] = v.now_us() + round(st.clock_offset * v.US)
        return out


class Texts:
    """The built-once statements of one store."""

    def __init__(self, items: Iterable[Text]) -> None:
        self._items = {item.name: item for item in items}
        self._in_callers: Texts | None = None

    def in_callers(self) -> Texts:
        """These statements as a submit in a caller's transaction runs them: each
        under its own name, but its variant (``name`` + :data:`IN_CALLERS`) where
        the dialect has one."""
        if self._in_callers is None:
            self._in_callers = Texts(
                replace(self._items.get(name + IN_CALLERS, text), name=name)
                for name, text in self._items.items()
                if not name.endswith(IN_CALLERS)
            )
        return self._in_callers

    def get(self, name: str) -> Text | None:
        """The statement ``name``, or ``None`` where the backend has none."""
        return self._items.get(name)

    def every(self, *names: str) -> list[Text] | None:
        """The statements ``names``, in that order, or ``None`` where the backend
        lacks any of them."""
        found = [self._items.get(name) for name in names]
        return None if None in found else [text for text in found if text is not None]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        """Every statement this store has, sorted."""
        return sorted(self._items)


def build(st: Seam, dialect: Dialect, own: Mapping[str, str] | None = None) -> Texts:
    """Build every statement for ``st`` (once, at open()): the dialect's SQL
    (:meth:`~conveyor.store.seam.Seam._statement_texts`, or ``own``) in its
    driver's parameter style."""
    pyformat = dialect.paramstyle == "pyformat"
    items = []
    for name, sql in sorted((st._statement_texts() if own is None else own).items()):
        *before, last = (to_pyformat(one) if pyformat else one for one in split(sql))
        clock, now = f":{OFFSET}" in sql, f":{CLOCK}" in sql
        items.append(Text(name, last, clock=clock, now=now, before=tuple(before)))
    return Texts(items)


#: The end of a script's statement: a ``;`` closing a line (not a comment line).
_END = re.compile(r"^(?!\s*--).*;[ \t]*$", re.MULTILINE)


def split(sql: str) -> list[str]:
    """The statements of one block: one, or a script's, each ended by a ``;`` at
    the end of a line (the ``;`` dropped)."""
    parts: list[str] = []
    start = 0
    for end in _END.finditer(sql):
        parts.append(sql[start : end.end()].rstrip().removesuffix(";").strip())
        start = end.end()
    parts.append(sql[start:].strip())
    return [part for part in parts if _code(part)]


def _code(sql: str) -> bool:
    """Whether ``sql`` holds more than comments and blank lines."""
    return any(line.strip() and not line.lstrip().startswith("--") for line in sql.splitlines())


#: A bind parameter in a statement file: ``:name``, not a ``::type`` cast.
_PARAM = re.compile(r"(?<![:\w]):(\w+)")
_BLOCK = re.compile(r"^-- name: (\S+)[ \t]*$", re.MULTILINE)


def to_pyformat(sql: str) -> str:
    """``sql`` with ``:name`` parameters as ``%(name)s`` (psycopg's style), and
    its literal ``%`` doubled."""
    return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))


def parse(source: str, where: str = "<sql>") -> dict[str, str]:
    """The statements of one SQL file, by name: each ``-- name: NAME`` line starts
    a statement that runs to the next such line (comments kept; surrounding blank
    lines and a trailing ``;`` dropped). A name given twice is an error."""
    found: dict[str, str] = {}
    marks = list(_BLOCK.finditer(source))
    if marks and source[: marks[0].start()].strip(" \t\n-"):
        head = source[: marks[0].start()]
        if any(line.strip() and not line.lstrip().startswith("--") for line in head.splitlines()):
            raise ValueError(f"{where}: SQL before the first '-- name:' line")
    for n, mark in enumerate(marks):
        end = marks[n + 1].start() if n + 1 < len(marks) else len(source)
        body = source[mark.end() : end].strip().removesuffix(";").rstrip()
        name = mark.group(1)
        if name in found:
            raise ValueError(f"{where}: statement {name!r} is named twice")
        if not body:
            raise ValueError(f"{where}: statement {name!r} is empty")
        found[name] = body
    return found


@functools.cache
def load(package: str) -> Mapping[str, str]:
    """Every statement of the SQL files in ``package``'s ``sql`` folder, by name
    (read once per process). A name in two files is an error."""
    found: dict[str, str] = {}
    folder = resources.files(package).joinpath("sql")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        where = f"{package}/sql/{entry.name}"
        for name, sql in parse(entry.read_text(encoding="utf-8"), where).items():
            if name in found:
                raise ValueError(f"{where}: statement {name!r} is also in another file")
            found[name] = sql
    return found


async def of(st: Seam) -> Texts:
    """The store's statements (opening it first if needed)."""
    if st._texts is None:
        await st.open()
    assert st._texts is not None
    return st._texts


async def get(st: Seam, name: str) -> Text | None:
    """The store's statement ``name``, or ``None`` where the backend has none."""
    return (await of(st)).get(name)


def runs_on(conn: AsyncConnection, st: Seam) -> bool:
    """Whether the built texts can run on ``conn``: always on the store's own
    connections; on a caller's (``submit(..., connection=...)``) only through a driver
    with the store's parameter style (a text is written in it: ``%(name)s`` on
    Postgres, which psycopg and psycopg2 read and asyncpg does not)."""
    if getattr(conn, "run_text", None) is not None or st._engine is None:
        return True
    return bool(conn.dialect.paramstyle == st._engine.dialect.paramstyle)


def usable(st: Seam, conn: AsyncConnection, name: str) -> Text | None:
    """The store's built statement ``name``, if it has one and it runs on ``conn``
    (:func:`runs_on`); ``None`` sends the caller its SQLAlchemy way."""
    built = st._texts.get(name) if st._texts is not None else None
    return built if built is not None and runs_on(conn, st) else None


async def execute(conn: AsyncConnection, st: Seam, text: Text, params: Mapping[str, Any]) -> Any:
    """Run ``text`` on ``conn`` inside the caller's transaction; its result (iterate
    it for rows; ``first()``, ``one()``, ``scalar_one()``, ``all()`` as SQLAlchemy's).
    On a connection that can run it on the driver's cursor itself (SQLite's
    connection thread, :meth:`~conveyor.store.protocol.transactions.InlineConnection.run_text`)
    it does, skipping SQLAlchemy's per-statement execution layer."""
    bound = text.bind(st, params)
    direct = getattr(conn, "run_text", None)
    if direct is not None:
        for sql in text.before:
            direct(sql, bound)
        return direct(text.sql, bound)
    for sql in text.before:
        await conn.exec_driver_sql(sql, bound)
    return await conn.exec_driver_sql(text.sql, bound)


async def execute_many(
    conn: AsyncConnection, st: Seam, text: Text, params: Iterable[Mapping[str, Any]]
) -> None:
    """Run ``text`` once per parameter set in ``params`` (``executemany``) inside the
    caller's transaction; on the driver's cursor where :func:`execute` would be.
    Not for a script."""
    assert not text.before, f"{text.name} is a script: run it with execute()"
    bound = [text.bind(st, one) for one in params]
    direct = getattr(conn, "run_text_many", None)
    if direct is not None:
        direct(text.sql, bound)
        return
    await conn.exec_driver_sql(text.sql, bound)


async def together(
    st: Seam,
    steps: Sequence[tuple[Text, Mapping[str, Any]]],
    *,
    write: bool = True,
    rows_of: int = -1,
    conn: AsyncConnection | None = None,
) -> list[Any]:
    """Run ``steps`` in order in one transaction, with the store's retries; the rows
    of the one at index ``rows_of`` (the last by default). Where the dialect has a
    :meth:`~conveyor.store.seam.Seam._steps_runner` they go to the server together
    (one round trip); else, or when it has no connection free, as an ordinary
    transaction. On ``conn`` (a caller's, in its transaction), one after another
    there, with no transaction or retry of ours."""
    runner = st._steps_runner()
    chosen = range(len(steps))[rows_of]

    async def work(conn: AsyncConnection) -> list[Any]:
        rows: list[Any] = []
        for n, (text, params) in enumerate(steps):
            result = await execute(conn, st, text, params)
            if n == chosen:
                rows = list(result)
        return rows

    if conn is not None:
        return await work(conn)
    if runner is None:
        return await tx.run(st, work, write=write)
    # A script's statements are steps of their own; its rows are its last one's.
    bound: list[tuple[str, Mapping[str, Any]]] = []
    rows_at = 0
    for n, (text, params) in enumerate(steps):
        one = text.bind(st, params)
        bound += [(sql, one) for sql in text.statements()]
        if n == chosen:
            rows_at = len(bound) - 1
    return await tx.run(st, work, write=write, together=lambda: runner(bound, rows_at))


async def alone(
    st: Seam, text: Text, params: Mapping[str, Any], *, write: bool = True
) -> list[Any]:
    """Run ``text`` by itself, committed on its own, with the store's retries; its
    rows. One round trip where the dialect runs single statements in autocommit; a
    script runs in a transaction of its own (:func:`together`)."""
    if text.before:
        return await together(st, [(text, params)], write=write)
    bound = text.bind(st, params)
    direct = st._direct_runner()

    async def work(conn: AsyncConnection) -> list[Any]:
        on_driver = getattr(conn, "run_text", None)
        if on_driver is not None:
            return list(on_driver(text.sql, bound))
        return list(await conn.exec_driver_sql(text.sql, bound))

    if direct is None:
        return await tx.run(st, work, write=write, autocommit=True)
    return await tx.run(
        st, work, write=write, autocommit=True, alone=lambda: direct(text.sql, bound)
    )
