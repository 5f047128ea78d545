"""``conveyor submit`` with ``--app`` (or ``$CONVEYOR_APP``) takes the task's
queue, priority and max attempts from the decorator; a task sent to a queue that
nothing consumes gets a warning."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import conveyor
from conveyor.cli import run

EXIT_USAGE = 2

APP = """
import conveyor

app = conveyor.App()

@app.task(queue="reports", priority=5, max_attempts=7)
def build_report(ctx, day):
    return day
"""


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONVEYOR_URL", raising=False)
    monkeypatch.delenv("CONVEYOR_APP", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "submitapp.py").write_text(textwrap.dedent(APP))
    return f"sqlite:///{tmp_path / 'c.db'}"


def submitted(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, object], str]:
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_app_supplies_the_task_settings(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    name = "submitapp.build_report"
    args = ["submit", name, "--payload", '{"day": "mon"}', "--url", url, "--json"]
    assert run([*args, "--app", "submitapp:app"]) == 0
    task, _ = submitted(capsys)
    assert (task["queue"], task["priority"], task["max_attempts"]) == ("reports", 5, 7)
    # Options given on the command line still win.
    assert run([*args, "--app", "submitapp:app", "--queue", "other", "--priority", "1"]) == 0
    task, _ = submitted(capsys)
    assert (task["queue"], task["priority"], task["max_attempts"]) == ("other", 1, 7)


def test_conveyor_app_env_works_like_app(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_APP", "submitapp:app")
    assert run(["submit", "submitapp.build_report", "--url", url, "--json"]) == 0
    task, _ = submitted(capsys)
    assert task["queue"] == "reports"


def test_a_short_name_gets_the_qualified_one_suggested(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["submit", "build_report", "--app", "submitapp:app", "--url", url]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "'submitapp.build_report'" in error and "name=" in error


def test_a_queue_nothing_consumes_gets_a_warning(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["submit", "report", "--url", url, "--json"]) == 0
    task, warning = submitted(capsys)
    assert task["queue"] == "default"
    assert "warning" in warning and "no worker" in warning and "--queues default" in warning
    # Once a worker has taken tasks from the queue, or it has settings, no warning.
    with conveyor.connect_sync(url) as store:
        [claimed] = store.claim("default", worker_id="w")
        store.succeed(claimed.id, worker_id="w")
        store.configure_queue("configured", max_attempts=2)
    for queue in ("default", "configured"):
        assert run(["submit", "report", "--queue", queue, "--url", url, "--json"]) == 0
        _, warning = submitted(capsys)
        assert warning == ""
