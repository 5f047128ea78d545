"""`conveyor queue set|show` and `conveyor maintain`, as a user runs them."""

from __future__ import annotations

import json
import time

from test_cli_commands import EXIT_USAGE, assert_one_line_error, ok_json, run_all, run_cli

import conveyor
from conveyor import Status


def test_queue_settings_round_trip(store_url: str) -> None:
    settings = ok_json(
        "queue",
        "set",
        "emails",
        "--lease",
        "60",
        "--max-attempts",
        "5",
        "--backoff",
        '{"base": 2, "max": 600}',
        "--retention",
        "86400",
        "--groups-only",
        url=store_url,
    )
    assert settings["lease"] == 60 and settings["max_attempts"] == 5
    assert settings["backoff"]["base"] == 2 and settings["backoff"]["max"] == 600
    assert settings["retention"] == 86400 and settings["queue_mode"] is False
    # options not given keep their value
    again = ok_json("queue", "set", "emails", "--max-wait", "30", url=store_url)
    assert again["lease"] == 60 and again["max_wait"] == 30
    shown, table, bad = run_all(
        ("queue", "show", "emails", "--json"),
        ("queue", "show", "emails"),
        ("queue", "set", "emails", "--max-attempts", "0"),
        url=store_url,
    )
    assert ok_json("queue", "show", "emails", url=store_url) == again
    assert shown.returncode == 0 and "max_wait" in table.stdout and "30s" in table.stdout
    assert "max_attempts" in assert_one_line_error(bad, EXIT_USAGE)
    # the defaults are used by submit
    with conveyor.connect_sync(store_url) as store:
        task = store.submit("t", queue="emails")
    assert task.max_attempts == 5


def test_maintain_runs_a_pass_and_stats_shows_it(store_url: str) -> None:
    with conveyor.connect_sync(store_url) as store:
        store.configure_queue("q", max_wait=1)
        task = store.submit("t", queue="q")
    time.sleep(1.2)  # the CLI process runs on the real clock: let max_wait pass
    counts = ok_json("maintain", url=store_url)
    assert counts["evicted"] == 1 and counts["skipped"] == 0
    stats = run_cli("stats", url=store_url)
    assert stats.returncode == 0 and "last maintenance" in stats.stdout
    with conveyor.connect_sync(store_url) as store:
        got = store.get(task.id)
    assert got is not None and got.status is Status.EVICTED


def test_a_dead_letter_queue_is_set_shown_and_cleared(store_url: str) -> None:
    """`--dead-letter` names where failed tasks go; the table shows it; '' clears
    it; a queue naming itself is refused (exit 2, the field named)."""
    settings = ok_json("queue", "set", "payments", "--dead-letter", "payments-dlq", url=store_url)
    assert settings["dead_letter"] == "payments-dlq"
    # At once: the show and the refused set leave the setting as it is.
    table, itself = run_all(
        ("queue", "show", "payments"),
        ("queue", "set", "payments", "--dead-letter", "payments"),
        url=store_url,
    )
    assert "dead_letter" in table.stdout and "payments-dlq" in table.stdout
    assert "dead_letter" in assert_one_line_error(itself, EXIT_USAGE)
    cleared = run_cli("queue", "set", "payments", "--dead-letter", "", "--json", url=store_url)
    assert cleared.returncode == 0
    assert ok_json("queue", "show", "payments", url=store_url)["dead_letter"] is None
    with conveyor.connect_sync(store_url) as store:
        store.configure_queue("payments", dead_letter="payments-dlq")
        task = store.submit("t", queue="payments", max_attempts=1)
        [got] = store.claim("payments", worker_id="w")
        store.fail(got.id, worker_id="w", error="declined")
        [letter] = store.list(queue="payments-dlq").items
    assert letter.parent_id == task.id and letter.status is Status.QUEUED


def test_a_queue_delay_is_set_shown_and_applied(store_url: str) -> None:
    """`--delay` is the queue's default delay: shown by `queue show`, added to a
    submit that gives none; a negative one is refused naming the field."""
    settings = ok_json("queue", "set", "digest", "--delay", "90", url=store_url)
    assert settings["delay"] == 90
    table, bad = run_all(
        ("queue", "show", "digest"),
        ("queue", "set", "digest", "--delay", "-1"),
        url=store_url,
    )
    assert "delay" in table.stdout and "90s" in table.stdout
    assert "delay" in assert_one_line_error(bad, EXIT_USAGE)
    with conveyor.connect_sync(store_url) as store:
        task = store.submit("t", queue="digest")
    assert task.run_at is not None and task.created_at is not None
    assert (task.run_at - task.created_at).total_seconds() == 90


def test_queue_pause_and_resume(store_url: str) -> None:
    with conveyor.connect_sync(store_url) as store:
        store.subscribe("orders", "billing")
        store.submit("t", queue="orders")
    paused = ok_json("queue", "pause", "orders", url=store_url)
    assert paused == {"queue": "orders", "group": None, "paused": True, "changed": True}
    # At once, as none of them changes what the others see.
    again, group, shown = run_all(
        ("queues", "pause", "orders"),
        ("queues", "pause", "orders", "--group", "billing"),
        ("queue", "show", "orders", "--json"),
        url=store_url,
    )
    assert again.returncode == 0 and "already paused" in again.stdout
    assert group.returncode == 0 and "for group billing: paused" in group.stdout
    assert json.loads(shown.stdout)["paused"] is True
    table = run_cli("stats", "--queue", "orders", url=store_url)
    assert table.returncode == 0 and "paused" in table.stdout
    with conveyor.connect_sync(store_url) as store:
        assert store.claim("orders", worker_id="w") == []
    stats = ok_json("stats", "--queue", "orders", url=store_url)
    assert stats[0]["paused"] is True and stats[0]["groups"]["billing"]["paused"] is True
    assert "paused" not in stats[0]["settings"]
    resumed, missing = run_all(
        ("queues", "resume", "orders"),
        ("queue", "resume", "orders", "--group", "nobody"),
        url=store_url,
    )
    assert resumed.returncode == 0 and "orders: resumed" in resumed.stdout
    line = assert_one_line_error(missing, 1)
    assert "group 'nobody'" in line and "conveyor groups list" in line
    with conveyor.connect_sync(store_url) as store:
        assert len(store.claim("orders", worker_id="w")) == 1
        assert store.claim("orders", worker_id="w", group="billing") == []  # its own pause
        assert store.resume("orders", group="billing") is True
        assert len(store.claim("orders", worker_id="w", group="billing")) == 1


def test_queue_max_depth_refuses_a_submit_with_exit_3(store_url: str) -> None:
    settings = ok_json("queue", "set", "orders", "--max-depth", "1", url=store_url)
    assert settings["max_depth"] == 1
    first = ok_json("submit", "t", "--queue", "orders", url=store_url)
    refused, shown, bad = run_all(
        ("submit", "t", "--queue", "orders"),
        ("queue", "show", "orders"),
        ("queue", "set", "orders", "--max-depth", "-1"),
        url=store_url,
    )
    line = assert_one_line_error(refused, 3)
    assert "queue 'orders' is full: 1 queued task(s), max_depth 1" in line
    assert "--max-depth" in line
    assert shown.returncode == 0 and "max_depth" in shown.stdout
    assert "max_depth" in assert_one_line_error(bad, EXIT_USAGE)
    cleared = ok_json("queue", "set", "orders", "--max-depth", "0", url=store_url)
    assert cleared["max_depth"] is None
    again = ok_json("submit", "t", "--queue", "orders", url=store_url)
    assert again["id"] != first["id"]


def test_queue_debounce_is_set_shown_and_cleared(store_url: str) -> None:
    settings = ok_json("queue", "set", "docs", "--debounce", "5", url=store_url)
    assert settings["debounce"] == 5
    shown, bad = run_all(
        ("queue", "show", "docs"),
        ("queue", "set", "docs", "--debounce", "-1"),
        url=store_url,
    )
    assert shown.returncode == 0 and "debounce" in shown.stdout and "5s" in shown.stdout
    assert "debounce" in assert_one_line_error(bad, EXIT_USAGE)
    with conveyor.connect_sync(store_url) as store:
        task = store.submit("t", queue="docs", partition="d")
        assert task.run_at is not None and task.created_at is not None
        assert (task.run_at - task.created_at).total_seconds() == 5
    assert ok_json("queue", "set", "docs", "--debounce", "0", url=store_url)["debounce"] is None


def test_flow_control_is_set_shown_and_cleared(store_url: str) -> None:
    """`--concurrency`, `--key-concurrency`, `--rate LIMIT/PER`, `--key-rate`,
    `--fair/--no-fair`: stored as configure_queue stores them, shown in the table
    (a rate as --rate takes it) and as JSON, 0 / --no-fair clear them; a bad rate
    is refused naming its option and writes nothing."""
    settings = ok_json(
        "queue",
        "set",
        "api",
        "--concurrency",
        "10",
        "--key-concurrency",
        "2",
        "--rate",
        "100/1s",
        "--key-rate",
        "5/1m",
        "--fair",
        url=store_url,
    )
    assert settings["concurrency"] == 10 and settings["key_concurrency"] == 2
    assert settings["rate"] == {"limit": 100, "per": 1.0}
    assert settings["key_rate"] == {"limit": 5, "per": 60.0}
    assert settings["fair"] is True
    with conveyor.connect_sync(store_url) as store:
        stored = store.get_queue("api")
    assert stored["rate"] == conveyor.Rate(100, per=1)
    assert stored["key_rate"] == conveyor.Rate(5, per=60)
    table, stats, seconds, units, *bad = run_all(
        ("queue", "show", "api"),
        ("stats", "--queue", "api", "--json"),
        ("queue", "set", "other", "--rate", "7/90", "--key-rate", "3/s", "--json"),
        ("queue", "set", "other2", "--rate", "10/500ms", "--key-rate", "1/1.5h", "--json"),
        ("queue", "set", "api", "--rate", "100"),
        ("queue", "set", "api", "--rate", "fast/1s"),
        ("queue", "set", "api", "--key-rate", "0/1s"),
        ("queue", "set", "api", "--rate", "5/0s"),
        ("queue", "set", "api", "--key-rate", "5/1w"),
        ("queue", "set", "api", "--concurrency", "-1"),
        url=store_url,
    )
    assert table.returncode == 0
    assert "100/1s" in table.stdout and "5/60s" in table.stdout and "fair" in table.stdout
    assert json.loads(stats.stdout)[0]["settings"]["rate"] == {"limit": 100, "per": 1.0}
    assert json.loads(seconds.stdout)["rate"] == {"limit": 7, "per": 90.0}
    assert json.loads(seconds.stdout)["key_rate"] == {"limit": 3, "per": 1.0}
    assert json.loads(units.stdout)["rate"] == {"limit": 10, "per": 0.5}
    assert json.loads(units.stdout)["key_rate"] == {"limit": 1, "per": 5400.0}
    for proc, option in zip(
        bad, ["--rate", "--rate", "--key-rate", "--rate", "--key-rate", "concurrency"], strict=True
    ):
        assert option in assert_one_line_error(proc, EXIT_USAGE)
    assert ok_json("queue", "show", "api", url=store_url) == settings  # nothing written
    cleared = ok_json(
        "queue",
        "set",
        "api",
        "--concurrency",
        "0",
        "--key-concurrency",
        "0",
        "--rate",
        "0",
        "--key-rate",
        "0",
        "--no-fair",
        url=store_url,
    )
    limits = ("concurrency", "key_concurrency", "rate", "key_rate")
    assert [cleared[k] for k in limits] == [None] * 4
    assert cleared["fair"] is False
