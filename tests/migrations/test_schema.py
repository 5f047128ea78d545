"""The Alembic revisions build exactly ``conveyor.schema``; version checks; concurrent
first opens (SPEC §1). Each test gets a brand-new database on each backend."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, inspect, pool, text
from sqlalchemy.engine import make_url

import conveyor
from _support import run_together, scratch_pg_database
from conveyor import ProtocolVersionMismatch
from conveyor.migrations import HEAD_REVISION, SCRIPT_LOCATION, VERSION_TABLE
from conveyor.schema import metadata


def _sync_engine(url: str) -> Engine:
    parsed = make_url(url)
    driver = "sqlite" if parsed.get_backend_name() == "sqlite" else "postgresql+psycopg"
    return create_engine(parsed.set(drivername=driver), poolclass=pool.NullPool)


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a database that has never seen conveyor."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    request.getfixturevalue("pg_url")  # skips (or fails in CI) without a server
    with scratch_pg_database("conveyor_schema") as url:
        yield url


def _alembic(engine: Engine, *args: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        if args[0] == "upgrade":
            command.upgrade(cfg, args[1])
        else:
            command.downgrade(cfg, args[1])


def _assert_matches_metadata(engine: Engine) -> None:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
        )
        diff = compare_metadata(context, metadata)
        tables = set(inspect(conn).get_table_names())
        versions = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    assert diff == [], f"the migrated schema differs from conveyor.schema: {diff}"
    assert tables == set(metadata.tables) | {VERSION_TABLE}
    assert len(versions) == 1
    _assert_partial_indexes_match(engine)
    if engine.dialect.name == "sqlite":
        _assert_sqlite_index_ddl_matches(engine)


def _index_ddl(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
        ).all()
    return {name: " ".join(sql.split()) for name, sql in rows}


def _assert_sqlite_index_ddl_matches(engine: Engine) -> None:
    """SQLite: every index is exactly what schema.py declares (the comparison above
    misses a column's sort order, which a table rebuild in batch mode loses)."""
    declared = create_engine("sqlite://", poolclass=pool.StaticPool)
    try:
        metadata.create_all(declared)
        assert _index_ddl(engine) == _index_ddl(declared)
    finally:
        declared.dispose()


NOISE = {"and", "in", "any", "array", "text", "character", "varying"}


def _where_words(clause: object) -> set[str]:
    """The words of a partial index's WHERE clause, minus how each database spells it."""
    if clause is None:
        return set()
    raw = str(getattr(clause, "text", clause)).lower()
    return set(re.findall(r"'[^']*'|[a-z_]+", raw)) - NOISE


def _assert_partial_indexes_match(engine: Engine) -> None:
    """compare_metadata does not look at WHERE clauses of partial indexes: we do."""
    dialect = engine.dialect.name
    with engine.connect() as conn:
        inspector = inspect(conn)
        for table in metadata.sorted_tables:
            reflected = {ix["name"]: ix for ix in inspector.get_indexes(table.name)}
            for index in table.indexes:
                found = reflected.get(index.name)
                assert found is not None, f"index {index.name} is missing"
                expected = _where_words(index.dialect_options[dialect].get("where"))
                actual = _where_words(found.get("dialect_options", {}).get(f"{dialect}_where"))
                assert actual == expected, f"{index.name}: WHERE {actual} != {expected}"


def _conveyor_tables(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {n for n in inspect(conn).get_table_names() if n.startswith("conveyor_")}


def test_alembic_upgrade_head_builds_the_schema(fresh_url: str) -> None:
    engine = _sync_engine(fresh_url)
    try:
        _alembic(engine, "upgrade", "head")
        _assert_matches_metadata(engine)
    finally:
        engine.dispose()


async def test_opening_a_store_builds_the_schema(fresh_url: str) -> None:
    async with conveyor.connect(fresh_url) as store:
        task = await store.submit("t")
    engine = _sync_engine(fresh_url)
    try:
        _assert_matches_metadata(engine)
    finally:
        engine.dispose()
    async with conveyor.connect(fresh_url) as again:  # reopening migrates nothing
        assert await again.get(task.id) == task


def test_downgrade_removes_everything_and_upgrade_rebuilds_it(fresh_url: str) -> None:
    engine = _sync_engine(fresh_url)
    try:
        _alembic(engine, "upgrade", "head")
        _alembic(engine, "downgrade", "base")
        assert _conveyor_tables(engine) <= {VERSION_TABLE}
        _alembic(engine, "upgrade", "head")
        _assert_matches_metadata(engine)
    finally:
        engine.dispose()


async def test_a_newer_protocol_version_is_refused(fresh_url: str) -> None:
    async with conveyor.connect(fresh_url):
        pass
    engine = _sync_engine(fresh_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE conveyor_meta SET value = '999' WHERE key = 'protocol_version'")
            )
    finally:
        engine.dispose()
    for migrate in (True, False):
        store = conveyor.connect(fresh_url, migrate=migrate)
        with pytest.raises(ProtocolVersionMismatch) as info:
            await store.open()
        assert info.value.code == "protocol_version_mismatch"
        await store.close()


async def test_an_unknown_schema_revision_is_refused(fresh_url: str) -> None:
    async with conveyor.connect(fresh_url):
        pass
    engine = _sync_engine(fresh_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = 'f00dfeedbeef'"))
    finally:
        engine.dispose()
    store = conveyor.connect(fresh_url)
    with pytest.raises(ProtocolVersionMismatch):
        await store.open()
    await store.close()
    engine = _sync_engine(fresh_url)
    try:
        assert _conveyor_tables(engine) == set(metadata.tables) | {VERSION_TABLE}
    finally:
        engine.dispose()


async def test_processes_opening_a_fresh_database_at_once(fresh_url: str) -> None:
    outputs = await asyncio.to_thread(run_together, [["open", fresh_url] for _ in range(3)])
    assert [json.loads(line) for line in outputs] == ["ok"] * 3
    engine = _sync_engine(fresh_url)
    try:
        _assert_matches_metadata(engine)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT key, value FROM conveyor_meta")).all()
        assert [tuple(r) for r in rows] == [("protocol_version", "2")]
    finally:
        engine.dispose()


async def test_stores_opening_a_fresh_database_at_once(fresh_url: str) -> None:
    stores = [conveyor.connect(fresh_url) for _ in range(4)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        tasks = await asyncio.gather(*(s.submit("t", {"n": i}) for i, s in enumerate(stores)))
        assert len({t.id for t in tasks}) == 4
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    engine = _sync_engine(fresh_url)
    try:
        _assert_matches_metadata(engine)
    finally:
        engine.dispose()


async def test_a_schema_behind_this_version_is_refused_without_migrate(fresh_url: str) -> None:
    # A database at an older revision, opened with migrate=False: refused at open()
    # with the command that fixes it, not with a driver error at the first call
    # that needs a newer table.
    engine = _sync_engine(fresh_url)
    try:
        _alembic(engine, "upgrade", "0003")
    finally:
        engine.dispose()
    store = conveyor.connect(fresh_url, migrate=False)
    with pytest.raises(conveyor.ConfigurationError, match="conveyor migrate") as info:
        await store.open()
    assert "0003" in str(info.value)
    await store.close()
    async with conveyor.connect(fresh_url) as store:  # migrate=True brings it up to date
        assert (await store.list()).items == []


def test_the_head_revision_constant_is_alembics_head() -> None:
    """A store at HEAD_REVISION opens without Alembic: a new migration must move it."""
    assert ScriptDirectory(SCRIPT_LOCATION).get_heads() == [HEAD_REVISION]


_OPEN_AT_HEAD = """
import asyncio, sys
import conveyor

async def main() -> None:
    async with conveyor.connect(sys.argv[1]) as st:
        await st.submit("t", queue="q")

asyncio.run(main())
print("alembic" in sys.modules)
"""


async def test_a_store_at_head_opens_without_loading_alembic(fresh_url: str) -> None:
    async with conveyor.connect(fresh_url):
        pass  # migrates: Alembic is needed here
    done = subprocess.run(
        [sys.executable, "-c", _OPEN_AT_HEAD, fresh_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "False", done.stderr


def _foreign_keys(engine: Engine) -> list[object]:
    with engine.connect() as conn:
        return inspect(conn).get_foreign_keys("conveyor_deliveries")


def _index_names(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {ix["name"] for ix in inspect(conn).get_indexes("conveyor_tasks")}


async def test_0005_keeps_the_data_and_downgrades_to_0004(fresh_url: str) -> None:
    """0005 drops the deliveries' foreign key and the (queue, created_at) index and
    makes the parent and correlation indexes partial; it keeps every row, and going
    back to 0004 restores all three."""
    engine = _sync_engine(fresh_url)
    try:
        _alembic(engine, "upgrade", "0004")
        assert len(_foreign_keys(engine)) == 1
    finally:
        engine.dispose()
    async with conveyor.connect(fresh_url) as store:  # migrates 0004 -> 0005 with rows in
        root = await store.submit("root", queue="q", correlation_id="c")
        child = await store.submit("child", queue="q", parent=root)
        await store.subscribe("q", "g", start="all")
        more = await store.submit_many([{"name": "x", "queue": "q"}] * 3)
    engine = _sync_engine(fresh_url)
    try:
        _assert_matches_metadata(engine)
        assert _foreign_keys(engine) == []
        assert "ix_conveyor_tasks_queue_created" not in _index_names(engine)
        _alembic(engine, "downgrade", "0004")
        [fk] = _foreign_keys(engine)
        assert fk["referred_table"] == "conveyor_tasks"  # type: ignore[index]
        assert fk["options"].get("ondelete") == "CASCADE"  # type: ignore[index]
        assert "ix_conveyor_tasks_queue_created" in _index_names(engine)
        with engine.connect() as conn:
            n = conn.execute(text("SELECT count(*) FROM conveyor_deliveries")).scalar()
        assert n == 2 * 5  # queue mode and group g, for each of the five tasks
        _alembic(engine, "upgrade", "head")
        _assert_matches_metadata(engine)
    finally:
        engine.dispose()
    async with conveyor.connect(fresh_url) as store:
        assert [t.id for t in await store.children(root.id)] == [child.id]
        assert [t.id for t in (await store.list(correlation_id="c")).items] == [root.id]
        assert len((await store.list(queue="q", group="g")).items) == 2 + len(more)


def _delivery_index_where(engine: Engine) -> dict[str, str | None]:
    """The WHERE of the status and roll-up indexes, as the server reflects it."""
    dialect = engine.dialect.name
    with engine.connect() as conn:
        found = inspect(conn).get_indexes("conveyor_deliveries")
    return {
        ix["name"]: " ".join(
            sorted(_where_words(ix.get("dialect_options", {}).get(f"{dialect}_where")))
        )
        or None
        for ix in found
        if ix["name"] in ("ix_conveyor_deliveries_status", "ix_conveyor_deliveries_unrolled")
    }


async def test_0006_keeps_the_data_and_downgrades_to_0005(fresh_url: str) -> None:
    """0006 leaves leased rows out of the status and roll-up indexes on Postgres
    (SQLite keeps both whole); every row stays, counts and listings agree, and going
    back to 0005 restores both indexes."""
    engine = _sync_engine(fresh_url)
    try:
        _alembic(engine, "upgrade", "0005")
        at_0005 = _delivery_index_where(engine)
    finally:
        engine.dispose()
    async with conveyor.connect(fresh_url) as store:  # migrates 0005 -> 0006 with rows in
        tasks = await store.submit_many([{"name": "x", "queue": "q"}] * 3)
        [held] = await store.claim("q", worker_id="w")
    engine = _sync_engine(fresh_url)
    try:
        _assert_matches_metadata(engine)
        at_head = _delivery_index_where(engine)
        if engine.dialect.name == "postgresql":
            assert at_0005 != at_head
            assert all("running" in (where or "") for where in at_head.values())
        else:
            assert at_0005 == at_head
        _alembic(engine, "downgrade", "0005")
        assert _delivery_index_where(engine) == at_0005
        _alembic(engine, "upgrade", "head")
        _assert_matches_metadata(engine)
    finally:
        engine.dispose()
    async with conveyor.connect(fresh_url) as store:
        [stats] = await store.stats("q")
        assert (stats.counts["queued"], stats.counts["running"]) == (2, 1)
        assert [t.id for t in (await store.list(status="running")).items] == [held.id]
        assert len((await store.list(status="queued")).items) == len(tasks) - 1


def _streams_index_columns(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        [found] = [
            ix
            for ix in inspect(conn).get_indexes("conveyor_streams")
            if ix["name"] == "ix_conveyor_streams_available"
        ]
    return [str(name) for name in found["column_names"]]


async def test_0008_orders_the_free_streams_and_downgrades_to_0007(fresh_url: str) -> None:
    """0008 rebuilds the free streams' index in claim order (priority descending,
    then how long the head has waited, then partition); streams claimed before and
    after it, and after going back to 0007 and forward again, keep their order."""
    engine = _sync_engine(fresh_url)
    try:
        _alembic(engine, "upgrade", "0007")
        assert _streams_index_columns(engine) == ["grp", "queue", "available_at"]
    finally:
        engine.dispose()
    async with conveyor.connect(fresh_url) as store:  # migrates 0007 -> 0008
        await store.submit_many(
            [{"name": "x", "queue": "q", "partition": f"p{i % 3}", "payload": i} for i in range(9)]
        )
        first = await store.claim("q", worker_id="w", limit=3, per_stream=1)
    engine = _sync_engine(fresh_url)
    try:
        _assert_matches_metadata(engine)
        assert _streams_index_columns(engine) == [
            "grp",
            "queue",
            "priority",
            "available_at",
            "partition",
        ]
        _alembic(engine, "downgrade", "0007")
        assert _streams_index_columns(engine) == ["grp", "queue", "available_at"]
        _alembic(engine, "upgrade", "head")
        _assert_matches_metadata(engine)
    finally:
        engine.dispose()
    async with conveyor.connect(fresh_url) as store:
        await store.ack_many([{"task_id": t.id, "worker_id": "w"} for t in first])
        second = await store.claim("q", worker_id="w", limit=3, per_stream=1)
    assert sorted(t.payload for t in first) == [0, 1, 2]
    assert sorted(t.payload for t in second) == [3, 4, 5]


async def test_conveyor_tables_without_a_recorded_revision_are_named(fresh_url: str) -> None:
    # The state an application's autogenerate left when it ran conveyor's upgrade
    # and rolled its version rows back: the tables, no revision. Opening (or
    # `conveyor migrate`) says so, instead of failing on CREATE TABLE with a hint
    # about a database that is not running.
    engine = _sync_engine(fresh_url)
    try:
        _alembic(engine, "upgrade", "head")
        with engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {VERSION_TABLE}"))
    finally:
        engine.dispose()
    store = conveyor.connect(fresh_url)
    with pytest.raises(conveyor.ConfigurationError, match="records no revision") as info:
        await store.open()
    await store.close()
    assert "conveyor_counts" in str(info.value) and "conveyor migrate" in str(info.value)
    migrated = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "migrate", "--url", fresh_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrated.returncode == 4
    assert "records no revision" in migrated.stderr
    assert "running" not in migrated.stderr and "already exists" not in migrated.stderr
