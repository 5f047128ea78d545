"""Statements built once (:mod:`conveyor.store.protocol.texts`), on both backends: built at
open() from the dialect's SQL files, run by themselves
with the store's retries, and inside a transaction."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from typing import Any

import psycopg
import pytest

import conveyor
from conveyor.errors import ConveyorError, InvalidArgument, StoreUnavailable
from conveyor.store.base import TaskStore
from conveyor.store.protocol import texts

PG_ONLY = ("claim.one", "claim.any")


def _sql(backend: str) -> dict[str, str]:
    clock = (
        "(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us"
        if backend == "postgres"
        else ":now_us"
    )
    return {
        "clock": f"SELECT {clock} AS now, :a + 1 AS a1",
        "count": "SELECT seq FROM conveyor_tasks WHERE name = :name",
    }


async def test_built_at_open_from_the_dialects_texts(store: TaskStore, backend: str) -> None:
    await store.open()
    assert store._texts is not None
    for name in PG_ONLY:
        assert (name in store._texts) == (backend == "postgres")
        assert (store._texts.get(name) is not None) == (backend == "postgres")


async def test_no_built_statement_binds_a_status_it_filters_on(store: TaskStore) -> None:
    """A status a statement filters on is written inline: SQLite matches a bound
    ``status = ?`` to a partial index by its value and then re-prepares the
    statement on every run (the claim's lease step cost ~200 µs of planning per
    call so)."""
    await store.open()
    assert store._texts is not None
    # A comparison (Core spaces it, ``status = :status_1``), not a SET (``status=:status``).
    bound = re.compile(r"status\s+(=|<>|!=|IN)\s+\(?\s*(:|%\(|\$|\?)", re.IGNORECASE)
    offenders = {
        name: match.group(0)
        for name in store._texts.names()
        for sql in store._texts[name].statements
        for match in [bound.search(sql)]
        if match is not None
    }
    assert offenders == {}


async def test_a_statement_runs_alone_with_the_clock_bound(store: TaskStore, backend: str) -> None:
    await store.open()
    assert store._engine is not None
    built = texts.build(store, store._engine.dialect, _sql(backend))
    assert built.names() == ["clock", "count"]
    clock = built.get("clock")
    assert clock is not None and (clock.clock or clock.now)
    (row,) = await texts.alone(store, clock, {"a": 41}, write=False)
    assert row.a1 == 42
    store.clock_offset = 3600.0
    (later,) = await texts.alone(store, clock, {"a": 1}, write=False)
    assert 3_500_000_000 < later.now - row.now < 3_700_000_000


async def test_a_built_once_clock_is_read_each_time_the_statement_runs(
    store: TaskStore, backend: str
) -> None:
    # SQLite's clock is the process's: built once, it must not stay the moment of open().
    await store.open()
    assert store._engine is not None
    clock = texts.build(store, store._engine.dialect, _sql(backend)).get("clock")
    assert clock is not None
    (first,) = await texts.alone(store, clock, {"a": 0}, write=False)
    await asyncio.sleep(0.01)
    (second,) = await texts.alone(store, clock, {"a": 0}, write=False)
    assert second.now - first.now >= 10_000


async def test_a_statement_runs_inside_a_transaction(store: TaskStore, backend: str) -> None:
    await store.submit("x", queue="q")
    await store.open()
    assert store._engine is not None
    count = texts.build(store, store._engine.dialect, _sql(backend)).get("count")
    assert count is not None

    async def work(conn: Any) -> list[Any]:
        return list(await texts.execute(conn, store, count, {"name": "x"}))

    assert len(await store._run(work, write=False)) == 1


def test_a_statement_file_is_read_by_its_name_lines() -> None:
    source = """-- the file's own comment
-- name: one
-- why it is so
SELECT 1 AS a;

-- name: two
SELECT :x::int AS b, '50%' AS c
"""
    found = texts.parse(source)
    assert found == {"one": "-- why it is so\nSELECT 1 AS a", "two": found["two"]}
    assert texts.to_pyformat(found["two"]) == "SELECT %(x)s::int AS b, '50%%' AS c"


def test_a_block_may_be_a_script_of_statements_ended_at_line_ends() -> None:
    block = """-- why it is so
INSERT INTO x VALUES (1, ';');
-- a comment that ends with one;
UPDATE x SET a = 2
WHERE b = 3;
SELECT a FROM x"""
    assert texts.split(block) == [
        "-- why it is so\nINSERT INTO x VALUES (1, ';')",
        "-- a comment that ends with one;\nUPDATE x SET a = 2\nWHERE b = 3",
        "SELECT a FROM x",
    ]
    assert texts.split("SELECT 1") == ["SELECT 1"]


def _script(last: str) -> dict[str, str]:
    add = "INSERT INTO conveyor_waiters (task_id, token, expires_at) VALUES ('s', :token, 0)"
    return {"script": f"{add};\n{last}"}


async def test_a_script_runs_its_statements_in_one_transaction(store: TaskStore) -> None:
    """A script runs by itself (texts.alone) or among steps (texts.together): its
    statements in order with the same parameters, the last one's rows returned, in
    one transaction (a failing statement takes the earlier ones back with it)."""
    await store.open()
    assert store._engine is not None
    count = "SELECT count(*) AS n FROM conveyor_waiters WHERE task_id = 's'"
    built = texts.build(store, store._engine.dialect, _script(count))
    script = built.get("script")
    assert script is not None and len(script.statements) == 2
    assert [row.n for row in await texts.alone(store, script, {"token": "a"})] == [1]
    rows = await texts.together(store, [(script, {"token": "b"}), (script, {"token": "c"})])
    assert [row.n for row in rows] == [3]
    bad = texts.build(store, store._engine.dialect, _script("SELECT * FROM nowhere"))
    failing = bad.get("script")
    assert failing is not None
    with pytest.raises(ConveyorError):
        await texts.alone(store, failing, {"token": "d"})
    assert [row.n for row in await texts.alone(store, script, {"token": "e"})] == [4]


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n", "named twice"),
        ("SELECT 0\n-- name: a\nSELECT 1\n", "before the first"),
        ("-- name: a\n\n-- name: b\nSELECT 1\n", "empty"),
    ],
)
def test_a_malformed_statement_file_is_refused(source: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        texts.parse(source)


def test_a_block_of_several_statements_is_a_script() -> None:
    """Statements ending with ``;`` at a line end (not in a comment) make a script,
    run in order; the last one's rows are the text's. Parameters read as JSON are
    known, for the lists given for them."""
    found = texts.parse(
        """-- name: s
-- first; not the end of a statement
INSERT INTO t SELECT value FROM json_each(:ids);
SELECT 'a;' AS x,
    :n::json AS y;
SELECT 1
"""
    )
    parts = texts.split(found["s"])
    assert [p.splitlines()[-1] for p in parts] == [
        "INSERT INTO t SELECT value FROM json_each(:ids)",
        "    :n::json AS y",
        "SELECT 1",
    ]
    assert parts[0].startswith("-- first; not")
    assert texts.json_params(found["s"]) == ("ids", "n")
    with pytest.raises(ValueError, match="only comments"):
        texts.split("SELECT 1;\n-- nothing after")


def test_a_block_of_comments_naming_another_statement_is_that_statement() -> None:
    found = texts.parse("-- name: a\nSELECT 1\n\n-- name: b\n-- the same\n-- as: a\n")
    assert found == {"a": "SELECT 1", "b": "SELECT 1"}
    with pytest.raises(ValueError, match="lacks"):
        texts.parse("-- name: b\n-- as: a\n")


def _script_sql(backend: str) -> dict[str, str]:
    add = "INSERT INTO conveyor_waiters (task_id, token, expires_at) VALUES ('s', :token, 0);\n"
    if backend == "sqlite":
        rows = "json_each(:tokens)"
    else:
        rows = "json_array_elements_text(:tokens::json)"
    return {
        "add": add + "SELECT count(*) AS n FROM conveyor_waiters WHERE task_id = 's'",
        "twice": add + add + "SELECT 1 AS x",
        "count": f"SELECT count(*) AS n FROM {rows}",
    }


async def test_a_script_runs_alone_in_one_transaction(store: TaskStore, backend: str) -> None:
    """A script run alone: its statements in order in one transaction (the last one
    sees what the first wrote; its rows come back), none of it kept when a later
    statement fails; inside a caller's transaction and together with other
    statements, the same."""
    await store.open()
    assert store._engine is not None
    built = texts.build(store, store._engine.dialect, _script_sql(backend))
    add, twice = built["add"], built["twice"]
    assert len(add.statements) == 2 and len(twice.statements) == 3
    assert [row.n for row in await texts.alone(store, add, {"token": "a"})] == [1]
    assert [row.n for row in await texts.alone(store, add, {"token": "b"}, inline=True)] == [2]
    with pytest.raises(ConveyorError):
        await texts.alone(store, twice, {"token": "c"})
    count = texts.Text("count", "SELECT count(*) AS n FROM conveyor_waiters")
    assert (await texts.alone(store, count, {}))[0].n == 2

    async def work(conn: Any) -> list[Any]:
        return list(await texts.execute(conn, store, add, {"token": "d"}))

    assert [row.n for row in await store._run(work)] == [3]
    steps = [(add, {"token": "e"}), (count, {})]
    assert [row.n for row in await texts.together(store, steps, rows_of=0)] == [4]
    with pytest.raises(ValueError, match="script"):
        await store._run(lambda conn: texts.execute_many(conn, store, add, [{"token": "f"}]))


async def test_a_list_for_a_parameter_read_as_json_is_encoded(
    store: TaskStore, backend: str
) -> None:
    """A Python list given for a parameter the statement reads as JSON text is
    bound as JSON (SQLite's driver binds no lists); JSON text given is left alone."""
    await store.open()
    assert store._engine is not None
    count = texts.build(store, store._engine.dialect, _script_sql(backend))["count"]
    assert count.lists == ("tokens",)
    assert (await texts.alone(store, count, {"tokens": ["a", "b", None]}))[0].n == 3
    assert (await texts.alone(store, count, {"tokens": '["a"]'}))[0].n == 1


async def test_a_refused_statement_is_a_store_error(store: TaskStore) -> None:
    bad = texts.Text("bad", "SELECT * FROM no_such_table")
    with pytest.raises(ConveyorError):
        await texts.alone(store, bad, {})


async def test_postgres_runs_alone_on_the_driver_connection(pg_url: str) -> None:
    async with conveyor.connect(pg_url) as store:
        assert store._direct_runner() is not None
    async with conveyor.connect(pg_url, timeouts="transaction") as store:
        # Outside a transaction the timeouts would not hold: through SQLAlchemy.
        assert store._direct_runner() is None
        pid = texts.Text("pid", "SELECT pg_backend_pid() AS pid")
        assert (await texts.alone(store, pid, {}))[0].pid > 0


async def test_postgres_a_dead_pooled_connection_is_retried(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    async with conveyor.connect(pg_url) as store:
        pid = texts.Text("pid", "SELECT pg_backend_pid() AS pid")
        first = (await texts.alone(store, pid, {}))[0].pid
        again = (await texts.alone(store, pid, {}))[0].pid
        assert again == first  # the pooled connection is reused
        dsn = pg_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        after = (await texts.alone(store, pid, {}))[0].pid
        assert after != first
    # The dead connection was discarded cleanly (its close runs in SQLAlchemy's
    # greenlet), not with an error logged by the pool.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_postgres_no_connection_to_be_had_is_store_unavailable(pg_url: str) -> None:
    dsn = pg_url.replace("postgresql+psycopg://", "postgresql://")
    base = dsn.rsplit("/", 1)[0]
    name = f"conveyor_closed_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        async with conveyor.connect(f"{base}/{name}") as store:
            pid = texts.Text("pid", "SELECT pg_backend_pid() AS pid")
            first = (await texts.alone(store, pid, {}))[0].pid
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                admin.execute("SELECT pg_terminate_backend(%s)", (first,))
            # The pooled connection is dead and no new one is allowed.
            with pytest.raises(StoreUnavailable):
                await texts.alone(store, pid, {})
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _waiter_steps(backend: str, token: str, then: str) -> list[tuple[texts.Text, dict[str, Any]]]:
    mark = "%(token)s" if backend == "postgres" else ":token"
    add = texts.Text(
        "add",
        f"INSERT INTO conveyor_waiters (task_id, token, expires_at) VALUES ('t', {mark}, 0)",
    )
    return [(add, {"token": token}), (texts.Text("then", then), {})]


async def test_steps_run_together_in_one_transaction(store: TaskStore, backend: str) -> None:
    """texts.together: the statements run in order in one transaction, the later
    ones seeing what the earlier wrote; the last one's rows come back. On Postgres
    they go to the server pipelined on a kept connection (the seam's steps runner),
    on SQLite as an ordinary transaction."""
    assert (store._steps_runner() is not None) is (backend == "postgres")
    count = "SELECT count(*) AS n FROM conveyor_waiters WHERE task_id = 't'"
    rows = await texts.together(store, _waiter_steps(backend, "a", count))
    assert [row.n for row in rows] == [1]
    rows = await texts.together(store, _waiter_steps(backend, "b", count))
    assert [row.n for row in rows] == [2]


async def test_steps_return_the_rows_of_the_step_asked_for(store: TaskStore, backend: str) -> None:
    """texts.together(rows_of=i): the rows of the i-th statement, though later ones
    ran after it (pipelined on Postgres, an ordinary transaction on SQLite)."""
    mark = "%(token)s" if backend == "postgres" else ":token"
    add = texts.Text(
        "add_returning",
        "INSERT INTO conveyor_waiters (task_id, token, expires_at) "
        f"VALUES ('r', {mark}, 0) RETURNING token",
    )
    count = texts.Text("count_r", "SELECT count(*) AS n FROM conveyor_waiters")
    drop = texts.Text("drop_r", "DELETE FROM conveyor_waiters WHERE task_id = 'r'")
    steps = [(add, {"token": "x"}), (count, {}), (drop, {})]
    assert [row.token for row in await texts.together(store, steps, rows_of=0)] == ["x"]
    assert [row.n for row in await texts.together(store, steps, rows_of=1)] == [1]
    assert [row.n for row in await texts.together(store, steps, rows_of=-2)] == [1]
    assert (await texts.alone(store, count, {}))[0].n == 0


async def test_a_failing_step_rolls_back_the_steps_before_it(
    store: TaskStore, backend: str
) -> None:
    # the second step inserts the first one's row again: a unique violation
    steps = _waiter_steps(backend, "c", "SELECT 1 AS x")
    with pytest.raises(ConveyorError):
        await texts.together(store, [steps[0], steps[0]])
    count = texts.Text("count", "SELECT count(*) AS n FROM conveyor_waiters")
    assert (await texts.alone(store, count, {}))[0].n == 0
    # and the store goes on working (a kept connection left mid-transaction is
    # closed, never reused)
    rows = await texts.together(
        store, _waiter_steps(backend, "d", "SELECT count(*) AS n FROM conveyor_waiters")
    )
    assert rows[0].n == 1


async def test_the_batch_runner_runs_one_statement_per_parameters_in_one_transaction(
    store: TaskStore, backend: str
) -> None:
    """The seam's batch runner (Postgres: runs pipelined on a kept connection; SQLite:
    every run's parameters taken first, then the runs on its connection thread) runs
    the statements once per parameters, in order; every run's rows come back in
    order; an exception from the parameters writes nothing of the runs."""
    await store.open()
    runner = store._batch_runner()
    mark = "%(token)s" if backend == "postgres" else ":token"
    add = (
        "INSERT INTO conveyor_waiters (task_id, token, expires_at) "
        f"VALUES ('b', {mark}, 0) RETURNING token, "
        # (Not counting its own row, which SQLite's RETURNING sees and Postgres's not.)
        f"(SELECT count(*) FROM conveyor_waiters WHERE task_id = 'b' AND token <> {mark}) "
        "AS before"
    )
    taken: list[str] = []

    def runs(tokens: list[str], fail_at: int | None = None) -> Any:
        for i, token in enumerate(tokens):
            if i == fail_at:
                raise InvalidArgument("token", "refused by the caller")
            taken.append(token)
            yield {"token": token}

    rows = await runner([add], runs(["x", "y", "z"]))
    assert rows is not None
    # Each run saw what the runs before it wrote (same transaction, in order).
    assert [(row.token, row.before) for row in rows] == [("x", 0), ("y", 1), ("z", 2)]
    with pytest.raises(InvalidArgument):
        await runner([add], runs(["p", "q", "r"], fail_at=2))
    assert taken == ["x", "y", "z", "p", "q"]
    count = texts.Text("count", "SELECT count(*) AS n FROM conveyor_waiters WHERE task_id = 'b'")
    assert (await texts.alone(store, count, {}))[0].n == 3  # p and q rolled back


async def test_the_batch_runner_runs_a_scripts_statements_in_order(
    store: TaskStore, backend: str
) -> None:
    """A script's statements, once per parameters: the rows of the last of each run."""
    await store.open()
    mark = "%(token)s" if backend == "postgres" else ":token"
    add = f"INSERT INTO conveyor_waiters (task_id, token, expires_at) VALUES ('s', {mark}, 0)"
    count = "SELECT count(*) AS n FROM conveyor_waiters WHERE task_id = 's'"
    rows = await store._batch_runner()([add, count], iter([{"token": "a"}, {"token": "b"}]))
    assert [row.n for row in rows or []] == [1, 2]


def test_a_statement_is_rebuilt_in_a_positional_drivers_style() -> None:
    """asyncpg's ``$n`` (a name read twice is one number) and ``%s`` (one per use,
    literal ``%`` doubled), each with the names in the order they are read; a
    ``:word`` in a comment is no parameter; a script's statements each their own."""
    sql = "-- see :nothing here\nSELECT :a, :b, :a, '5%' WHERE x = :c;\nSELECT :b"
    dollar = texts.made("s", sql, "numeric_dollar")
    assert dollar.before == ("\nSELECT $1, $2, $1, '5%' WHERE x = $3",)
    assert dollar.sql == "SELECT $1"
    assert dollar.orders == (("a", "b", "c"), ("b",))
    fmt = texts.made("s", sql, "format")
    assert fmt.before == ("\nSELECT %s, %s, %s, '5%%' WHERE x = %s",)
    assert fmt.orders == (("a", "b", "a", "c"), ("b",))
    named = texts.made("s", sql, "pyformat")
    assert named.orders == () and "%(a)s" in named.before[0]


def test_a_list_parameter_not_given_is_null() -> None:
    """A JSON list the statement reads and the caller leaves out is bound as NULL
    (no list): one statement of a dialect may serve kinds that give fewer lists."""
    text = texts.made("s", "SELECT value FROM json_each(:keys), json_each(:ids)", "named")
    bound = text.bind(_Clockless(), {"ids": ["a"]})
    assert bound == {"ids": '["a"]', "keys": None}


class _Clockless:
    clock_offset = 0.0
