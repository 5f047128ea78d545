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

A block may be a *script*: several statements, each ending with ``;`` at the end
of a line (not a comment line), run in order in the same transaction with the
same parameters, the rows of the last one returned (SQLite, which has no
data-modifying CTEs, writes a submit so). A parameter the statement reads as JSON
text (``json_each(:name)``, ``:name::json``) may be given as a Python list: it is
encoded once, when the parameters are bound (:meth:`Text.bind`).

Running:

* :func:`alone` — one statement by itself, committed on its own (autocommit where
  the dialect allows; a script in a transaction), with the store's retries; on
  Postgres it runs on a driver connection kept in autocommit (:mod:`.pg_direct`),
  skipping SQLAlchemy's execution layer and pool;
* :func:`execute` — one statement inside a transaction the caller runs
  (:func:`conveyor.store.protocol.transactions.run`).

Both bind ``offset_us`` (the store's ``clock_offset`` in microseconds) for
statements whose clock reads it (see :func:`now`). Rows come back as tuples with
attribute access by column name.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, ColumnElement, bindparam
from sqlalchemy.engine import Dialect

from conveyor import _values as v
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

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
    """One statement as driver text."""

    name: str
    sql: str
    #: Values of parameters fixed at build time (Core literals); merged under the
    #: caller's.
    fixed: Mapping[str, Any] = field(default_factory=dict)
    #: Whether the text reads ``offset_us``.
    clock: bool = False
    #: Whether the text reads ``now_us`` (a process clock, read per run).
    now: bool = False
    #: A script's statements before the last (``sql``), in order: run first, in the
    #: same transaction and with the same parameters, their rows dropped.
    before: tuple[str, ...] = ()
    #: The parameters the text reads as JSON text: a list given for one is encoded,
    #: and one not given is NULL (no list).
    lists: tuple[str, ...] = ()
    #: The block as the SQL file has it (``:name`` parameters): rebuilt from it in
    #: another driver's style (:meth:`Texts.in_style`).
    source: str = ""
    #: Where the driver's style is positional: each statement's parameter names in
    #: the order it reads them (the statements' order); empty where it is named.
    orders: tuple[tuple[str, ...], ...] = ()

    @property
    def statements(self) -> tuple[str, ...]:
        """Every statement of the text, in the order they run (``sql`` last)."""
        return (*self.before, self.sql)

    def bind(self, st: Seam, params: Mapping[str, Any]) -> dict[str, Any]:
        """The driver parameters for one run."""
        out = {**self.fixed, **params} if self.fixed else dict(params)
        for name in self.lists:
            value = out.get(name)
            if value.__class__ is list:
                out[name] = json.dumps(value)
            elif name not in out:
                out[name] = None
        if self.clock:
            out[OFFSET] = round(st.clock_offset * v.US)
        if self.now:
            out[CLOCK] = v.now_us() + round(st.clock_offset * v.US)
        return out


class Texts:
    """The built-once statements of one store."""

    def __init__(self, items: Iterable[Text], paramstyle: str = "named") -> None:
        self._items = {item.name: item for item in items}
        self._in_callers: Texts | None = None
        #: The driver parameter style the statements are written in.
        self.paramstyle = paramstyle
        self._styles: dict[str, Texts] = {paramstyle: self}

    def in_style(self, paramstyle: str) -> Texts:
        """These statements in another driver's parameter style (a caller's
        connection through another driver: asyncpg's ``$1``, say), built once."""
        found = self._styles.get(paramstyle)
        if found is None:
            found = self._styles[paramstyle] = Texts(
                (made(item.name, item.source, paramstyle) for item in self._items.values()),
                paramstyle,
            )
        return found

    def in_callers(self) -> Texts:
        """These statements as a submit in a caller's transaction runs them: each
        under its own name, but its variant (``name`` + :data:`IN_CALLERS`) where
        the dialect has one."""
        if self._in_callers is None:
            self._in_callers = Texts(
                (
                    replace(self._items.get(name + IN_CALLERS, text), name=name)
                    for name, text in self._items.items()
                    if not name.endswith(IN_CALLERS)
                ),
                self.paramstyle,
            )
        return self._in_callers

    def get(self, name: str) -> Text | None:
        """The statement ``name``, or ``None`` where the backend has none."""
        return self._items.get(name)

    def __getitem__(self, name: str) -> Text:
        """The catalogue statement ``name``, which every dialect has."""
        found = self._items.get(name)
        if found is None:
            raise KeyError(f"the dialect has no statement {name!r} (see conveyor.store.catalogue)")
        return found

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        """Every statement this store has, sorted."""
        return sorted(self._items)


def build(st: Seam, dialect: Dialect, own: Mapping[str, str] | None = None) -> Texts:
    """Build every statement for ``st`` (once, at open()): the dialect's SQL
    (:meth:`~conveyor.store.seam.Seam._statement_texts`, or ``own``) in its
    driver's parameter style."""
    style = dialect.paramstyle
    statements = st._statement_texts() if own is None else own
    return Texts((made(name, sql, style) for name, sql in sorted(statements.items())), style)


def made(name: str, sql: str, paramstyle: str) -> Text:
    """The statement ``name`` of SQL ``sql`` (``:name`` parameters) in the driver
    parameter style ``paramstyle``: psycopg's ``%(name)s`` (``pyformat``), a
    positional ``%s`` (``format``) or ``$1`` (``numeric_dollar``, asyncpg's), else
    as written (``named``; SQLite's driver reads ``:name`` whatever it declares)."""
    parts = split(sql)
    orders: list[tuple[str, ...]] = []
    driver: list[str] = []
    for part in parts:
        if paramstyle == "pyformat":
            driver.append(to_pyformat(part))
        elif paramstyle in ("format", "numeric_dollar"):
            text, order = to_positional(part, paramstyle)
            driver.append(text)
            orders.append(order)
        else:
            driver.append(part)
    return Text(
        name,
        driver[-1],
        clock=f":{OFFSET}" in sql,
        now=f":{CLOCK}" in sql,
        before=tuple(driver[:-1]),
        lists=json_params(sql),
        source=sql,
        orders=tuple(orders),
    )


#: A bind parameter in a statement file: ``:name``, not a ``::type`` cast.
_PARAM = re.compile(r"(?<![:\w]):(\w+)")
_BLOCK = re.compile(r"^-- name: (\S+)[ \t]*$", re.MULTILINE)
#: A parameter read as JSON text: ``json_each(:name)`` (SQLite), ``:name::json``.
_JSON_PARAM = re.compile(r"json_each\(\s*:(\w+)\s*\)|(?<![:\w]):(\w+)::json\b")


def json_params(sql: str) -> tuple[str, ...]:
    """The parameters ``sql`` reads as JSON text, sorted: where a Python list is
    given for one, :meth:`Text.bind` encodes it (the driver of a dialect without
    arrays, SQLite's, cannot bind a list)."""
    return tuple(sorted({a or b for a, b in _JSON_PARAM.findall(sql)}))


def split(sql: str) -> list[str]:
    """The statements of one block, in order: a script's end each with ``;`` at the
    end of a line that is not a comment; a block without one is one statement.
    Each is kept with the comments above it, its ``;`` dropped."""
    parts: list[str] = []
    lines: list[str] = []
    for line in sql.splitlines():
        lines.append(line)
        code = line.rstrip()
        if code.endswith(";") and not code.lstrip().startswith("--"):
            parts.append("\n".join(lines).strip().removesuffix(";").rstrip())
            lines = []
    rest = "\n".join(lines).strip()
    if rest:
        parts.append(rest)
    for part in parts:
        if all(not ln.strip() or ln.lstrip().startswith("--") for ln in part.splitlines()):
            raise ValueError(f"a statement of the script is only comments: {part!r}")
    return parts


def to_positional(sql: str, paramstyle: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` (one statement) with positional parameters, and the names they read,
    in order: ``$1``, ``$2``… (``numeric_dollar``: a name read twice is one number)
    or ``%s`` (``format``: one per use, literal ``%`` doubled). Comments go first:
    a ``:word`` in one is no parameter."""
    code = _COMMENT.sub("", sql)
    if paramstyle == "numeric_dollar":
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        return _PARAM.sub(number, code), tuple(names)
    uses = tuple(_PARAM.findall(code))
    return _PARAM.sub("%s", code.replace("%", "%%")), uses


#: A comment to the end of its line (the SQL files keep ``--`` out of literals).
_COMMENT = re.compile(r"--[^\n]*")


def to_pyformat(sql: str) -> str:
    """``sql`` with ``:name`` parameters as ``%(name)s`` (psycopg's style), and
    its literal ``%`` doubled."""
    return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))


def parse(source: str, where: str = "<sql>") -> dict[str, str]:
    """The statements of one SQL file, by name: each ``-- name: NAME`` line starts
    a statement that runs to the next such line (comments kept; surrounding blank
    lines and a trailing ``;`` dropped). A block of comments only, one of them
    ``-- as: OTHER``, is the file's statement ``OTHER`` under a second name (where
    a dialect's variant is the statement itself). A name given twice is an error."""
    found: dict[str, str] = {}
    aliases: dict[str, str] = {}
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
        lines = [line.strip() for line in body.splitlines() if line.strip()]
        same = [line.removeprefix("-- as:").strip() for line in lines if line.startswith("-- as:")]
        if same and all(line.startswith("--") for line in lines):
            aliases[name] = same[0]
            continue
        found[name] = body
    for name, other in aliases.items():
        if other not in found:
            raise ValueError(f"{where}: statement {name!r} is {other!r}, which the file lacks")
        found[name] = found[other]
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


def on(st: Seam, conn: AsyncConnection) -> Texts:
    """The store's statements as they run on ``conn``: the store's own (its own
    connections, or a caller's through the same driver), else the same statements
    in the parameter style of the caller's driver (``submit(..., connection=...)``
    through asyncpg, say: :meth:`Texts.in_style`)."""
    built = st._texts
    assert built is not None, "the store is not open"
    if getattr(conn, "run_text", None) is not None:
        return built
    style = conn.dialect.paramstyle
    return built if style == built.paramstyle else built.in_style(style)


async def execute(conn: AsyncConnection, st: Seam, text: Text, params: Mapping[str, Any]) -> Any:
    """Run ``text`` on ``conn`` inside the caller's transaction; its result (iterate
    it for rows; ``first()``, ``one()``, ``scalar_one()``, ``all()`` as SQLAlchemy's).
    On a connection that can run it on the driver's cursor itself (SQLite's
    connection thread, :meth:`~conveyor.store.protocol.transactions.InlineConnection.run_text`)
    it does, skipping SQLAlchemy's per-statement execution layer."""
    return await execute_bound(conn, text, text.bind(st, params))


async def execute_bound(conn: AsyncConnection, text: Text, bound: Mapping[str, Any]) -> Any:
    """:func:`execute` with the parameters bound already (:meth:`Text.bind`): a
    script's statements in order, the last one's result."""
    direct = getattr(conn, "run_text", None)
    if direct is not None:
        for sql in text.before:
            direct(sql, bound)
        return direct(text.sql, bound)
    if text.orders:  # a positional driver: the values in each statement's order
        *firsts, last = (tuple(bound[n] for n in order) for order in text.orders)
        for sql, values in zip(text.before, firsts, strict=True):
            await conn.exec_driver_sql(sql, values)
        return await conn.exec_driver_sql(text.sql, last)
    for sql in text.before:
        await conn.exec_driver_sql(sql, bound)
    return await conn.exec_driver_sql(text.sql, bound)


async def execute_many(
    conn: AsyncConnection, st: Seam, text: Text, params: Iterable[Mapping[str, Any]]
) -> None:
    """Run ``text`` (one statement, not a script) once per parameter set in
    ``params`` (``executemany``) inside the caller's transaction; on the driver's
    cursor where :func:`execute` would be."""
    if text.before:
        raise ValueError(f"{text.name}: a script cannot run once per parameter set")
    bound = [text.bind(st, one) for one in params]
    direct = getattr(conn, "run_text_many", None)
    if direct is not None:
        direct(text.sql, bound)
        return
    if text.orders:
        (order,) = text.orders
        await conn.exec_driver_sql(text.sql, [tuple(one[n] for n in order) for one in bound])
        return
    await conn.exec_driver_sql(text.sql, bound)


async def together(
    st: Seam,
    steps: Sequence[tuple[Text, Mapping[str, Any]]],
    *,
    write: bool = True,
    rows_of: int = -1,
    conn: AsyncConnection | None = None,
    inline: bool = False,
) -> list[Any]:
    """Run ``steps`` in order in one transaction, with the store's retries; the rows
    of the one at index ``rows_of`` (the last by default). Where the dialect has a
    :meth:`~conveyor.store.seam.Seam._steps_runner` they go to the server together
    (one round trip); else, or when it has no connection free, as an ordinary
    transaction. On ``conn`` (a caller's, in its transaction), one after another
    there, with no transaction or retry of ours. ``inline``: a short write the
    dialect's connection runner may run on the caller's thread (see :func:`alone`)."""
    chosen = range(len(steps))[rows_of]
    bound = [text.bind(st, params) for text, params in steps]
    runner = st._steps_runner()

    async def work(conn: AsyncConnection) -> list[Any]:
        rows: list[Any] = []
        for n, ((text, _), params) in enumerate(zip(steps, bound, strict=True)):
            result = await execute_bound(conn, text, params)
            if n == chosen:
                rows = list(result)
        return rows

    if conn is not None:
        return await work(conn)
    if runner is None:
        return await tx.run(st, work, write=write, inline=inline)
    # Each script's statements as steps of their own; the rows asked for are those
    # of the chosen step's last statement.
    flat: list[tuple[str, Mapping[str, Any]]] = []
    at = -1
    for n, ((text, _), params) in enumerate(zip(steps, bound, strict=True)):
        flat += [(sql, params) for sql in text.statements]
        if n == chosen:
            at = len(flat) - 1
    return await tx.run(st, work, write=write, inline=inline, together=lambda: runner(flat, at))


async def alone(
    st: Seam,
    text: Text,
    params: Mapping[str, Any],
    *,
    write: bool = True,
    inline: bool = False,
) -> list[Any]:
    """Run ``text`` by itself, committed on its own, with the store's retries; its
    rows. One round trip where the dialect runs single statements in autocommit; a
    script in one transaction. ``inline``: a short write that the dialect's
    connection runner may run on the caller's thread (see
    :func:`conveyor.store.protocol.transactions.run`)."""
    bound = text.bind(st, params)

    async def work(conn: AsyncConnection) -> list[Any]:
        result = await execute_bound(conn, text, bound)
        # A statement without rows (a DELETE) gives none, as the direct runner's
        # does; SQLAlchemy's result refuses to be iterated then.
        return list(result) if getattr(result, "returns_rows", True) else []

    if text.before:
        # Several statements: never autocommit, which would commit each alone.
        return await tx.run(st, work, write=write, inline=inline)
    direct = st._direct_runner()
    if direct is None:
        return await tx.run(st, work, write=write, autocommit=True, inline=inline)
    return await tx.run(
        st,
        work,
        write=write,
        autocommit=True,
        inline=inline,
        alone=lambda: direct(text.sql, bound),
    )
