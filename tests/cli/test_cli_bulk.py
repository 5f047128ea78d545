"""``conveyor tasks retry|cancel|purge``, run as a subprocess against real databases."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from test_cli_commands import EXIT_USAGE, assert_one_line_error, ok_json, run_all, run_cli

import conveyor
from conveyor import Status


def fail_all(store: conveyor.SyncStore, queue: str) -> None:
    while held := store.claim(queue, worker_id="w"):
        store.fail(held[0].id, worker_id="w", error="boom", retryable=False)


def test_retry_cancel_purge(store_url: str, sync_store: conveyor.SyncStore) -> None:
    a = [sync_store.submit("a", queue="q", max_attempts=1) for _ in range(3)]
    b = [sync_store.submit("b", queue="q", max_attempts=1) for _ in range(2)]
    fail_all(sync_store, "q")
    queued = sync_store.submit("a", queue="q")

    dry = ok_json("tasks", "retry", "--queue", "q", "--name", "a", "--dry-run", url=store_url)
    assert dry == {"action": "retry", "queue": "q", "group": None, "dry_run": True, "count": 3}
    assert {sync_store.get(t.id).status for t in a} == {Status.FAILED}  # type: ignore[union-attr]
    human = run_cli("tasks", "retry", "--queue", "q", "--dry-run", url=store_url)
    assert human.returncode == 0, human.stderr
    assert "would retry 5 task(s) of queue q (queue mode)" in human.stdout
    assert "nothing written" in human.stdout

    done = ok_json("tasks", "retry", "--queue", "q", "--name", "a", url=store_url)
    assert done["count"] == 3 and done["dry_run"] is False
    assert {sync_store.get(t.id).status for t in a} == {Status.QUEUED}  # type: ignore[union-attr]

    human = run_cli("tasks", "cancel", "--queue", "q", "--limit", "2", url=store_url)
    assert human.returncode == 0, human.stderr
    assert "cancelled 2 task(s) of queue q" in human.stdout
    rest = ok_json("tasks", "cancel", "--queue", "q", "--status", "queued", url=store_url)
    assert rest["count"] == 2  # three retried and one queued, two cancelled already

    purged = ok_json("tasks", "purge", "--queue", "q", "--status", "cancelled", url=store_url)
    assert purged["count"] == 4
    assert [sync_store.get(t.id) for t in [*a, queued]] == [None] * 4
    assert {sync_store.get(t.id).status for t in b} == {Status.FAILED}  # type: ignore[union-attr]
    nothing = run_cli("tasks", "purge", "--queue", "q", "--status", "succeeded", url=store_url)
    assert nothing.returncode == 0 and "no tasks match" in nothing.stdout


def test_a_group_and_a_time_window(store_url: str, sync_store: conveyor.SyncStore) -> None:
    sync_store.subscribe("q", "g")
    tasks = [sync_store.submit("job", queue="q") for _ in range(2)]
    cancelled = ok_json("tasks", "cancel", "--queue", "q", "--group", "g", url=store_url)
    assert cancelled == {
        "action": "cancel",
        "queue": "q",
        "group": "g",
        "dry_run": False,
        "count": 2,
    }
    assert [sync_store.get(t.id, group="g").status for t in tasks] == ["cancelled"] * 2  # type: ignore[union-attr]
    assert [sync_store.get(t.id).status for t in tasks] == ["queued"] * 2  # type: ignore[union-attr]
    before, after = run_all(
        ("tasks", "retry", "--queue", "q", "--group", "g", "--status", "any",
         "--finished-before", "2000-01-01T00:00:00Z", "--json"),
        ("tasks", "retry", "--queue", "q", "--group", "g", "--status", "cancelled",
         "--finished-after", "2000-01-01T00:00:00+02:00", "--dry-run", "--json"),
        url=store_url,
    )  # fmt: skip
    assert before.returncode == 0 and '"count": 0' in before.stdout
    assert after.returncode == 0 and '"count": 2' in after.stdout


def test_bad_input_is_one_line_and_writes_nothing(
    store_url: str, sync_store: conveyor.SyncStore
) -> None:
    task = sync_store.submit("job", queue="q", max_attempts=1)
    fail_all(sync_store, "q")
    calls = [
        ("tasks", "retry", "--queue", "q", "--status", "succeeded"),
        ("tasks", "cancel", "--queue", "q", "--status", "failed"),
        ("tasks", "purge", "--queue", "q", "--finished-after", "2026-01-01T00:00:00"),
        ("tasks", "retry", "--queue", "q", "--finished-before", "last tuesday"),
        ("tasks", "retry", "--queue", "q", "--limit", "0"),
        ("tasks", "retry"),
    ]
    procs = run_all(*calls, url=store_url)
    lines = [assert_one_line_error(proc, EXIT_USAGE) for proc in procs]
    assert "status" in lines[0] and "failed, cancelled, evicted" in lines[0]
    assert "status" in lines[1]
    assert "--finished-after needs a time zone" in lines[2]
    assert "--finished-before is not an ISO 8601 time" in lines[3]
    assert "--limit" in lines[4]
    assert "--queue" in lines[5]
    assert sync_store.get(task.id).status is Status.FAILED  # type: ignore[union-attr]


def test_the_one_task_commands_stay(store_url: str) -> None:
    top, tasks = run_all(("--help",), ("tasks", "--help"), url=None)
    assert top.returncode == 0 and tasks.returncode == 0, tasks.stderr
    for command in ("cancel", "retry", "tasks"):
        assert f" {command} " in top.stdout
    for command in ("retry", "cancel", "purge"):
        assert f" {command} " in tasks.stdout


def test_a_long_run_shows_a_progress_bar(store_url: str, sync_store: conveyor.SyncStore) -> None:
    sync_store.submit_many([{"name": "job", "queue": "q"} for _ in range(1_100)])
    assert sync_store.cancel_where(queue="q") == 1_100
    # stderr on a terminal: the bar is for a person watching.
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_URL"}
    command = [sys.executable, "-m", "conveyor.cli", "tasks", "retry", "--queue", "q"]
    proc = subprocess.Popen(
        [*command, "--status", "cancelled", "--url", store_url],
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
        env=env,
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    out, _ = proc.communicate(timeout=120)
    os.close(leader)
    assert proc.returncode == 0
    assert "retried 1100 task(s)" in out
    assert b"retry q" in shown and b"/1100" in shown
    assert sync_store.cancel_where(queue="q", status="running") == 0
    assert sync_store.internal.count_where("cancel", queue="q", status="queued") == 1_100
