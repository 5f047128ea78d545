"""A command's SQLite store (conveyor.store.sqlite.oneshot under
conveyor.sync_store.CallerLoopStore): the same store, its transactions on a
blocking connection in the command's own thread. It waits for another
process's write lock instead of failing, closes its file, and refuses what
it cannot do."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import conveyor
from conveyor.errors import ConfigurationError, MigrationRequired
from conveyor.store.sqlite.oneshot import OneShotSQLiteStore
from conveyor.sync_store import CallerLoopStore

#: Holds the write lock of the file given until told to let go (a line on stdin).
HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


def _store(path: Path, *, migrate: bool = True) -> CallerLoopStore:
    return CallerLoopStore(OneShotSQLiteStore(f"sqlite+aiosqlite:///{path}", migrate=migrate))


def test_a_write_waits_for_another_process_holding_the_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with conveyor.connect_sync(f"sqlite:///{db}") as store:
        task = store.submit("t", queue="q")
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_URL"}
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"
        stdin = holder.stdin
        # Let go only once the command has started (and met the lock).
        release = threading.Timer(2.0, lambda: (stdin.write("\n"), stdin.flush()))
        release.start()
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "conveyor.cli",
                    "cancel",
                    task.id,
                    "--url",
                    f"sqlite:///{db}",
                ],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            release.join()
        holder.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    with conveyor.connect_sync(f"sqlite:///{db}") as store:
        found = store.get(task.id)
    assert found is not None and found.status is conveyor.Status.CANCELLED


def test_reads_and_writes_like_the_plain_store(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with _store(db) as store:
        task = store.submit("t", {"n": 1}, queue="q")
        assert store.get(task.id) == task
        (report,) = store.stats("q")
        assert report.counts["queued"] == 1
        assert [t.id for t in store.list(queue="q").items] == [task.id]
    with conveyor.connect_sync(f"sqlite:///{db}") as plain:
        assert plain.get(task.id) == task


def test_closing_releases_the_file(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("needs /proc")

    def open_files() -> set[str]:
        found = set()
        for fd in fds.iterdir():
            try:
                found.add(os.readlink(fd))
            except OSError:
                continue
        return found

    store = _store(db)
    store.submit("t", queue="q")
    assert str(db) in open_files()
    store.close()
    assert not {f for f in open_files() if f.startswith(str(db))}
    store.close()  # again: nothing


def test_no_schema_is_refused_and_not_created(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    store = _store(db, migrate=False)
    with pytest.raises(MigrationRequired):
        store.open()
    store.close()
    with sqlite3.connect(db) as conn:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    conn.close()
    assert tables == []


def test_a_callers_connection_is_refused(tmp_path: Path) -> None:
    from sqlalchemy import create_engine

    db = tmp_path / "c.db"
    engine = create_engine(f"sqlite:///{db}")
    with _store(db) as store, engine.begin() as conn:
        with pytest.raises(ConfigurationError, match="connection"):
            store.submit("t", queue="q", connection=conn)
    engine.dispose()
    with conveyor.connect_sync(f"sqlite:///{db}") as plain:
        assert plain.stats() == []
