"""What a new user meets first on the command line: --version, --help, hints that
match their cause, read-only commands that do not create a database, and
messages that read as English. Run in-process (``conveyor.cli.run``) for speed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import conveyor
from conveyor.cli import run

EXIT_CONFLICT, EXIT_UNAVAILABLE = 3, 4


@pytest.fixture(autouse=True)
def _fresh_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONVEYOR_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "200")


def test_version_prints_the_version_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"conveyor {conveyor.__version__}"


@pytest.mark.parametrize(
    "command", [[], ["demo"], ["submit"], ["worker"], ["list"], ["queue", "set"]]
)
def test_help_shows_flags_without_a_type(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run([*command, "--help"]) == 0
    shown = capsys.readouterr().out
    assert "--help" in shown
    assert "<bool>" not in shown


def test_demo_keep_is_a_proper_flag_pair(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["demo", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "--keep" in shown and "--no-keep" in shown


@pytest.mark.parametrize(
    "command", [["stats"], ["list"], ["get", "01ABC"], ["queue", "show", "q"], ["cancel", "01ABC"]]
)
def test_read_only_commands_do_not_create_a_database(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(command) == EXIT_UNAVAILABLE
    error = capsys.readouterr().err
    assert not (tmp_path / "conveyor.db").exists()
    assert "conveyor.db" in error and "does not exist" in error
    assert error.count("\n") == 1  # one line, no traceback
    # No --url and no $CONVEYOR_URL: the hint says where it looked and how to point elsewhere.
    assert "--url" in error


@pytest.mark.parametrize("command", [["cancel", "01ABC"], ["retry", "01ABC"]])
def test_commands_that_write_do_not_claim_to_only_read(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(command) == EXIT_UNAVAILABLE
    error = capsys.readouterr().err
    assert "only reads" not in error and "does not create a database" in error


def test_listing_an_unknown_group_says_there_is_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with conveyor.connect_sync(url) as store:
        store.submit("x", queue="q")
        store.subscribe("q", "billing")
    assert run(["list", "--group", "biling", "--url", url]) == 0
    shown = capsys.readouterr().out
    assert "no queue has a consumer group 'biling'" in shown
    assert run(["list", "--group", "billing", "--status", "failed", "--url", url]) == 0
    shown = capsys.readouterr().out
    assert "no tasks match" in shown and "consumer group" not in shown


def test_a_missing_file_named_by_url_is_blamed_on_the_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'typo.db'}"
    assert run(["stats", "--url", url]) == EXIT_UNAVAILABLE
    error = capsys.readouterr().err
    assert "typo.db" in error and "does not exist" in error
    assert "set $CONVEYOR_URL" not in error


def test_a_sqlite_file_in_a_missing_folder_is_not_a_server_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'nowhere' / 'c.db'}"
    assert run(["submit", "x", "--url", url]) == EXIT_UNAVAILABLE
    error = capsys.readouterr().err
    assert "nowhere" in error and "folder" in error
    assert "running" not in error
    assert not (tmp_path / "nowhere").exists()


def test_a_bad_url_given_with_url_does_not_suggest_passing_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["stats", "--url", "mysql://x/y"]) == EXIT_UNAVAILABLE
    error = capsys.readouterr().err
    assert "mysql" in error
    assert "pass --url or set $CONVEYOR_URL" not in error


def test_cancel_of_a_finished_task_reads_as_english(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with conveyor.connect_sync(url) as store:
        task = store.submit("x", queue="q")
        [claimed] = store.claim("q", worker_id="w")
        store.progress(claimed.id, worker_id="w", progress=0.5, message="rendered")
        store.succeed(claimed.id, worker_id="w", result=1)
    assert run(["cancel", task.id, "--url", url]) == EXIT_CONFLICT  # left as it was
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert "was succeeded" not in shown
    assert "already succeeded" in captured.err
    # Progress belongs to a running task; a succeeded one does not show "50% rendered".
    assert "50%" not in shown and "rendered" not in shown
    assert run(["list", "--url", url]) == 0
    listing = capsys.readouterr().out
    assert re.search(r"\b20\d\d-\d\d-\d\d \d\d:\d\d", listing), listing


def test_a_negative_timedelta_is_shown_in_seconds() -> None:
    from datetime import timedelta

    from conveyor import _values as v

    with pytest.raises(conveyor.InvalidArgument) as caught:
        v.duration_seconds("delay", timedelta(seconds=-5))
    assert "-5 s" in str(caught.value)
    assert "datetime.timedelta" not in str(caught.value)
