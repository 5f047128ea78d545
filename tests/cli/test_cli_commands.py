"""The ``conveyor`` command line, run as a subprocess against real databases.

Set-up that is not under test (bulk tasks, claims, failures) goes through the
blocking store; what the user types goes through ``python -m conveyor.cli``.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import conveyor
from conveyor import Status

EXIT_NOT_FOUND, EXIT_USAGE, EXIT_CONFLICT, EXIT_UNAVAILABLE, EXIT_PROTOCOL = 1, 2, 3, 4, 5


def run_cli(
    *args: str, url: str | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the CLI; ``url`` is passed as ``--url``; ``$CONVEYOR_URL`` is cleared."""
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_URL"}
    command = [sys.executable, "-m", "conveyor.cli", *args]
    if url is not None:
        command += ["--url", url]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


def run_all(*calls: tuple[str, ...], url: str | None) -> list[subprocess.CompletedProcess[str]]:
    """Run independent CLI calls at once (each start-up costs about a second)."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda args: run_cli(*args, url=url), calls))


def parsed(proc: subprocess.CompletedProcess[str]) -> Any:
    """The JSON a successful ``--json`` call printed."""
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def ok_json(*args: str, url: str) -> Any:
    """Run a command with ``--json``, assert success, return the parsed output."""
    return parsed(run_cli(*args, "--json", url=url))


def conveyor_head() -> str:
    """The newest schema revision this conveyor ships."""
    from alembic.script import ScriptDirectory

    from conveyor.migrations import SCRIPT_LOCATION

    [head] = ScriptDirectory(SCRIPT_LOCATION).get_heads()
    return head


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The failure contract: the exit code, one ``error:`` line, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr + proc.stdout
    return lines[0]


def test_submit_and_get(store_url: str) -> None:
    task = ok_json(
        "submit",
        "send_email",
        "--payload",
        '{"to": "a@b.c", "n": [1, 2]}',
        "--queue",
        "emails",
        "--priority",
        "5",
        "--delay",
        "60",
        "--partition",
        "cust-1",
        "--max-attempts",
        "7",
        url=store_url,
    )
    assert task["name"] == "send_email"
    assert task["payload"] == {"to": "a@b.c", "n": [1, 2]}
    assert (task["queue"], task["partition"], task["priority"]) == ("emails", "cust-1", 5)
    assert task["max_attempts"] == 7 and task["status"] == "queued" and task["attempt"] == 0
    assert task["run_at"] > task["created_at"]  # ISO strings in UTC sort by time

    as_json, human = run_all(("get", task["id"], "--json"), ("get", task["id"]), url=store_url)
    assert parsed(as_json) == task
    assert human.returncode == 0, human.stderr
    for text in (task["id"], "send_email", "emails", "queued", "cust-1", '"to": "a@b.c"'):
        assert text in human.stdout


def test_key_twice_returns_the_same_task(store_url: str) -> None:
    first = ok_json("submit", "charge", "--key", "order-7", "--payload", "1", url=store_url)
    assert first["key"] == "order-7"
    second, rejected = run_all(
        ("submit", "charge", "--key", "order-7", "--payload", "2"),
        ("submit", "charge", "--key", "order-7", "--conflict", "reject"),
        url=store_url,
    )
    assert second.returncode == 0, second.stderr
    assert "submitted" in second.stdout and first["id"] in second.stdout
    line = assert_one_line_error(rejected, EXIT_CONFLICT)
    assert "order-7" in line and first["id"] in line and "hint" in line


def test_list_pages_with_cursor(store_url: str, sync_store: conveyor.SyncStore) -> None:
    made = sync_store.submit_many(
        [{"name": f"job{i}", "queue": "pages"} for i in range(5)]
        + [{"name": "other", "queue": "elsewhere"}]
    )
    ids = [t.id for t in made[:5]]

    first, human, oldest = run_all(
        ("list", "--queue", "pages", "--limit", "3", "--json"),
        ("list", "--limit", "4"),
        ("list", "--queue", "pages", "--limit", "3", "--oldest-first", "--json"),
        url=store_url,
    )
    page = parsed(first)
    assert set(page) == {"items", "next_cursor"}
    # Newest first by default; --oldest-first in submit order.
    assert [item["id"] for item in page["items"]] == ids[:1:-1]
    assert [item["id"] for item in parsed(oldest)["items"]] == ids[:3]
    assert all(item["queue"] == "pages" and item["status"] == "queued" for item in page["items"])
    assert page["next_cursor"]
    last, mixed = run_all(
        ("list", "--queue", "pages", "--limit", "3", "--cursor", page["next_cursor"], "--json"),
        ("list", "--queue", "pages", "--cursor", page["next_cursor"], "--oldest-first"),
        url=store_url,
    )
    last_page = parsed(last)
    assert [item["id"] for item in last_page["items"]] == ids[1::-1]
    assert last_page["next_cursor"] is None
    assert "order" in assert_one_line_error(mixed, EXIT_USAGE)

    assert human.returncode == 0, human.stderr
    assert made[5].id in human.stdout and all(i in human.stdout for i in ids[2:])
    assert ids[0] not in human.stdout and ids[1] not in human.stdout
    assert "newest first" in human.stdout
    assert "--cursor" in human.stdout  # tells the reader how to get the next page
    assert "error" not in human.stdout  # no failed task on the page: no error column


def test_list_says_why_failed_tasks_failed(store_url: str, sync_store: conveyor.SyncStore) -> None:
    ok = sync_store.submit("fine", queue="why")
    bad = sync_store.submit("broken", queue="why")
    again = sync_store.submit("flaky", queue="why", max_attempts=3)
    for task in sync_store.claim("why", worker_id="w", limit=3):
        if task.id == ok.id:
            sync_store.succeed(task.id, worker_id="w", attempt=task.attempt)
        else:
            message = "disk full on /var" if task.id == bad.id else "try later"
            sync_store.fail(
                task.id,
                worker_id="w",
                attempt=task.attempt,
                error=message,
                retryable=task.id != bad.id,
                delay=600,
            )
    listed, retrying = run_all(("list", "--queue", "why"), ("get", again.id), url=store_url)
    assert listed.returncode == 0, listed.stderr
    header = next(line for line in listed.stdout.splitlines() if " id " in f" {line} ")
    assert header.split()[-1] == "error"
    rows = {line.split()[0]: line for line in listed.stdout.splitlines() if line.strip()}
    assert "disk full on /var" in rows[bad.id]
    assert "try later" not in rows[again.id]  # queued for a retry: not failed
    assert retrying.returncode == 0, retrying.stderr
    assert "last error" in retrying.stdout and "try later" in retrying.stdout


def test_cancel_and_retry(store_url: str, sync_store: conveyor.SyncStore) -> None:
    task = sync_store.submit("work", {"x": 1}, queue="cr")
    sync_store.subscribe("cr", "audit")
    [claimed] = sync_store.claim("cr", worker_id="w", group="audit")
    sync_store.fail(claimed.id, worker_id="w", group="audit", error="boom", retryable=False)

    cancelled, group_view = run_all(
        ("cancel", task.id, "--json"), ("get", task.id, "--group", "audit"), url=store_url
    )
    cancelled_task = parsed(cancelled)
    assert cancelled_task["id"] == task.id and cancelled_task["status"] == "cancelled"
    assert cancelled_task["finished_at"] is not None
    assert group_view.returncode == 0, group_view.stderr
    assert "failed" in group_view.stdout and "boom" in group_view.stdout

    retried, group_retry = run_all(
        ("retry", task.id, "--reset-attempts", "--json"),
        ("retry", task.id, "--group", "audit", "--json"),
        url=store_url,
    )
    assert parsed(retried)["status"] == "queued" and parsed(retried)["group"] is None
    by_group = parsed(group_retry)
    assert by_group["group"] == "audit" and by_group["status"] == "queued"
    assert by_group["attempt"] == 1  # the attempt budget is kept without --reset-attempts

    # Queued now: nothing to retry. The task is shown, and the exit code says so.
    noop = run_cli("retry", task.id, url=store_url)
    done = run_cli("cancel", task.id, url=store_url)  # after the retry: one at a time
    assert noop.returncode == EXIT_CONFLICT and task.id in noop.stdout
    assert "unchanged" in noop.stderr and "only failed" in noop.stderr
    assert done.returncode == 0, done.stderr
    # Cancelled already: the cancel is where it wanted to be; a finished task refuses it.
    again = run_cli("cancel", task.id, url=store_url)
    assert again.returncode == 0 and "already cancelled" in again.stderr
    finished = sync_store.submit("work", queue="cr-done")
    [held] = sync_store.claim("cr-done", worker_id="w")
    sync_store.succeed(held.id, worker_id="w", attempt=held.attempt)
    refused = run_cli("cancel", finished.id, url=store_url)
    assert refused.returncode == EXIT_CONFLICT and "already succeeded" in refused.stderr


def test_stats(store_url: str, sync_store: conveyor.SyncStore) -> None:
    sync_store.configure_queue("st", max_attempts=9, lease=45)
    sync_store.subscribe("st", "analytics")
    tasks = sync_store.submit_many([{"name": "e", "queue": "st"} for _ in range(3)])
    [claimed] = sync_store.claim("st", worker_id="w")
    sync_store.succeed(claimed.id, worker_id="w")
    sync_store.cancel(tasks[2].id)
    sync_store.submit("other", queue="st-other")

    as_json, human = run_all(("stats", "--queue", "st", "--json"), ("stats",), url=store_url)
    reports = parsed(as_json)
    assert isinstance(reports, list) and [r["queue"] for r in reports] == ["st"]
    [report] = reports
    assert report["counts"]["queued"] == 1
    assert report["counts"]["succeeded"] == 1 and report["counts"]["cancelled"] == 1
    assert report["oldest_claimable_age"] is not None and report["oldest_claimable_age"] >= 0
    group = report["groups"]["analytics"]
    assert group["lag"] == 2 and group["counts"]["cancelled"] == 1
    assert report["settings"]["max_attempts"] == 9 and report["settings"]["lease"] == 45

    assert human.returncode == 0, human.stderr
    for text in ("st-other", "queue mode", "group analytics", "max_attempts=9"):
        assert text in human.stdout


def test_failures_are_one_line(store_url: str) -> None:
    # First: read-only commands refuse a SQLite file that does not exist yet.
    revision = parsed(run_cli("migrate", "--json", url=store_url))
    assert revision["revision"] == revision["head"] == conveyor_head()
    missing, bad_payload = run_all(
        ("get", "01ARZ3NDEKTSV4RRFFQ69G5FAV"),
        ("submit", "x", "--payload", "{not json"),
        url=store_url,
    )
    line = assert_one_line_error(missing, EXIT_NOT_FOUND)
    assert "not found" in line and "hint" in line
    line = assert_one_line_error(bad_payload, EXIT_USAGE)
    assert "--payload" in line and "JSON" in line


def test_errors_without_a_database(tmp_path: Path) -> None:
    bad_scheme, unreachable, bad_option, bad_app, help_ = run_all(
        ("list", "--url", "mysql://user@localhost/db"),
        ("stats", "--url", "postgresql://postgres@127.0.0.1:1/none"),
        ("submit", "x", "--priority", "high"),
        ("worker", "no_such_module_here:app"),
        ("--help",),
        url=None,
    )
    line = assert_one_line_error(bad_scheme, EXIT_UNAVAILABLE)
    assert "mysql" in line and "sqlite://" in line and "postgresql://" in line
    assert "127.0.0.1" in assert_one_line_error(unreachable, EXIT_UNAVAILABLE)
    assert "--priority" in assert_one_line_error(bad_option, EXIT_USAGE)
    assert "no_such_module_here" in assert_one_line_error(bad_app, EXIT_USAGE)
    assert help_.returncode == 0
    text = " ".join(help_.stdout.split())
    assert "Exit codes" in text and "5 protocol mismatch" in text


def test_migrate_a_fresh_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    proc = run_cli("migrate", url=url)
    assert proc.returncode == 0, proc.stderr
    assert "none (empty database)" in proc.stderr and "revision" in proc.stdout
    again = ok_json("migrate", url=url)
    assert again["before"] == [again["head"]] and again["applied"] == []

    # A database written by an incompatible conveyor is refused with exit 5.
    with closing(sqlite3.connect(tmp_path / "fresh.db")) as db, db:
        db.execute("UPDATE conveyor_meta SET value = '999' WHERE key = 'protocol_version'")
    line = assert_one_line_error(run_cli("list", url=url), EXIT_PROTOCOL)
    assert "999" in line


def test_worker_runs_an_app_until_sigterm(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "cli_worker_app.py").write_text(
        textwrap.dedent(
            """
            import conveyor

            app = conveyor.App()

            @app.task(name="double", queue="cli-work")
            def double(ctx, n):
                return {"doubled": n * 2}
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_URL"}
    with conveyor.connect_sync(store_url) as store:
        task = store.submit("double", {"n": 21}, queue="cli-work")
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "conveyor.cli", "worker", "cli_worker_app:app"),
                *("--queues", "cli-work", "--concurrency", "2", "--url", store_url),
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            done = store.wait(task.id, timeout=30)
            # Idle now, and listed among the live workers.
            listed, human = run_all(("workers", "--json"), ("workers",), url=store_url)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    assert done.status is Status.SUCCEEDED, done.error
    assert done.result == {"doubled": 42}
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    [shown] = parsed(listed)
    assert shown["queues"] == ["cli-work"] and shown["concurrency"] == 2
    assert shown["pid"] == proc.pid and shown["tasks"] == [] and shown["group"] is None
    assert human.returncode == 0, human.stderr
    assert shown["worker_id"] in human.stdout and "1 live worker(s), 0 busy" in human.stdout
    # Stopped: gone from the list, and "stopped" is the last thing it said.
    after = run_cli("workers", url=store_url)
    assert after.returncode == 0 and "no live worker" in after.stdout
    assert err.strip().splitlines()[-1].endswith(f"worker {shown['worker_id']} stopped")


@pytest.mark.parametrize("processes", ["1", "2"])
def test_sigterm_while_the_app_is_still_importing_stops_cleanly(
    tmp_path: Path, processes: str
) -> None:
    """A deploy that stops a worker right after starting it: the signal comes while
    the application is imported. It is a stop request like any other (exit 0,
    nothing claimed), not a kill (exit 143)."""
    (tmp_path / "slow_app.py").write_text(
        textwrap.dedent(
            """
            import pathlib, time
            import conveyor

            pathlib.Path("importing").touch()
            time.sleep(4)  # a heavy import
            app = conveyor.App()

            @app.task(name="never", queue="slow")
            def never(ctx):
                raise AssertionError("must not run")
            """
        )
    )
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with conveyor.connect_sync(url) as store:
        task = store.submit("never", queue="slow")
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_URL"}
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "conveyor.cli", "worker", "slow_app:app"),
            *("--queues", "slow", "--url", url, "--processes", processes),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):
            if (tmp_path / "importing").exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    if processes == "1":
        assert err.strip().splitlines()[-1].endswith("stopped before its first claim"), err
    with conveyor.connect_sync(url) as store:
        left = store.get(task.id)
    assert left is not None and left.status is Status.QUEUED and left.attempt == 0
