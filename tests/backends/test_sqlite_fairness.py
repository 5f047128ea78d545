"""SQLite: a process waiting for the write lock gets it in the next gap another
process leaves, instead of sleeping past the gaps in SQLite's busy handler."""

from __future__ import annotations

import logging
import re
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import pytest

import conveyor

# Holds the write lock 50 ms at a time, leaving it free 2 ms in between, like a
# process whose transactions follow each other closely.
HOLDER = textwrap.dedent(
    """
    import sqlite3, sys, time
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("PRAGMA busy_timeout = 10000")
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        db.execute("BEGIN IMMEDIATE")
        time.sleep(0.05)
        db.execute("COMMIT")
        time.sleep(0.002)
    """
)


def test_a_writer_gets_the_lock_in_the_gaps_another_process_leaves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "fair.db"
    url = f"sqlite:///{path}"
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    # busy_timeout well above one hold (50 ms), far below SQLite's own back-off
    # reaching one of the 2 ms gaps by chance.
    with conveyor.connect_sync(url, busy_timeout=0.3) as store:
        store.submit("warm", queue="q")
        holder = subprocess.Popen(
            [sys.executable, str(script), str(path), "30"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "ready"
            with caplog.at_level(logging.DEBUG, logger="conveyor"):
                for i in range(8):
                    store.submit("t", {"i": i}, queue="q")
        finally:
            holder.kill()
            holder.communicate()
    # Every write found a gap within its busy_timeout: none had to be retried.
    retried = [r for r in caplog.records if "transient database error" in r.getMessage()]
    assert retried == []


#: What a plan step may scan whole: the batch's items, and the script's own
#: one-row and derived tables.
_SCANNED = re.compile(r"^SCAN (j VIRTUAL TABLE|CONSTANT ROW|one|i|k|lost)\b")


@pytest.mark.parametrize("name", ["ack_plain", "ack_streams", "succeed_plain", "task_views"])
async def test_the_ack_lookup_probes_by_id_not_through_the_history(
    tmp_path: Path, name: str
) -> None:
    """Every statement of an acknowledgement starts from the batch's ids (one index
    probe each), never from the group's delivery rows, which hold the history, nor
    from every stream; only the stream recompute looks at a queue's leased rows."""
    path = tmp_path / "plan.db"
    params = {
        "items": '[["x","w","",null,"1"]]',
        "now_us": 1,
        "ids": '["x"]',
        **{"id": "x", "grp": "", "worker_id": "w", "attempt": None, "result": "1"},
    }
    async with conveyor.connect(f"sqlite:///{path}") as store:
        await store.open()
        assert store._texts is not None
        text = store._texts.get(name)
        assert text is not None
        with closing(sqlite3.connect(path)) as db:
            plans = [
                [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql, params)]
                for sql in text.statements
            ]
    for sql, plan in zip(text.statements, plans, strict=True):
        scans = [step for step in plan if step.startswith("SCAN")]
        assert all(_SCANNED.match(step) for step in scans), plan
        if "INSERT INTO conveyor_streams" not in sql:
            assert not any("ix_conveyor_deliveries_status" in step for step in plan), plan
    if name != "succeed_plain":
        assert plans[0][0].startswith("SCAN j"), plans[0]
