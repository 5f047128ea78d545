"""One URL rule for every command, the worker and ``App``: ``--url``, else
``$CONVEYOR_URL``, else the App's own URL, else ``sqlite:///conveyor.db``. The
worker's start line and ``conveyor stats`` say which database they use, the
password masked. Everything runs as a user would run it: subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

import conveyor
from conveyor import Status

PASSWORD = "s3cret-pw"

APP = """
import conveyor

app = conveyor.App("sqlite:///hardcoded.db")   # the App's own URL

@app.task(name="echo", queue="url-rule")
def echo(ctx, word):
    return word
"""


def _env(conveyor_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CONVEYOR_URL", "CONVEYOR_APP")}
    if conveyor_url is not None:
        env["CONVEYOR_URL"] = conveyor_url
    return env


def cli(*args: str, cwd: Path, conveyor_url: str | None = None) -> subprocess.CompletedProcess[str]:
    """``conveyor ARGS`` in ``cwd``, with ``$CONVEYOR_URL`` set to ``conveyor_url`` (or unset)."""
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *args],
        cwd=cwd,
        env=_env(conveyor_url),
        capture_output=True,
        text=True,
        timeout=120,
    )


def shown(url: str) -> str:
    """How a URL is shown: no driver, password masked."""
    parsed = make_url(url)
    return parsed.set(drivername=parsed.get_backend_name()).render_as_string(hide_password=True)


def run_worker_until(
    done: list[str], url: str, cwd: Path, *args: str, conveyor_url: str | None = None
) -> str:
    """Run ``conveyor worker rule_app:app`` until the tasks ``done`` have finished
    (read on ``url``); returns its log."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "rule_app:app", "-q", "url-rule", *args],
        cwd=cwd,
        env=_env(conveyor_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with conveyor.connect_sync(url) as store:
            for task_id in done:
                assert store.wait(task_id, timeout=60).status is Status.SUCCEEDED
    finally:
        proc.send_signal(signal.SIGTERM)
        _, log = proc.communicate(timeout=60)
    assert proc.returncode == 0, log
    return log


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "rule_app.py").write_text(textwrap.dedent(APP))
    return tmp_path


@pytest.fixture
def deployed(store_url: str, backend: str) -> str:
    """The deployment's database; on Postgres with a password (the test server
    trusts, so it is ignored there) to show that it never appears."""
    if backend == "postgres":
        return make_url(store_url).set(password=PASSWORD).render_as_string(False)
    return store_url


def submitted_id(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    import json

    task_id = json.loads(proc.stdout)["id"]
    assert isinstance(task_id, str)
    return task_id


def test_conveyor_url_wins_over_the_apps_url_everywhere(deployed: str, project: Path) -> None:
    # The issue this settles: $CONVEYOR_URL set for the deployment, an App that
    # names another database. Producer with and without the App, and the worker,
    # all work on $CONVEYOR_URL.
    plain = cli(
        *("submit", "echo", "-q", "url-rule", "--payload", '{"word": "plain"}', "--json"),
        cwd=project,
        conveyor_url=deployed,
    )
    with_app = cli(
        *("submit", "echo", "--app", "rule_app:app", "--payload", '{"word": "app"}', "--json"),
        cwd=project,
        conveyor_url=deployed,
    )
    ids = [submitted_id(plain), submitted_id(with_app)]
    log = run_worker_until(ids, deployed, project, conveyor_url=deployed)
    assert f"database {shown(deployed)} (from $CONVEYOR_URL)" in log
    assert not (project / "hardcoded.db").exists()

    stats = cli("stats", cwd=project, conveyor_url=deployed)
    assert stats.returncode == 0, stats.stderr
    assert f"database {shown(deployed)} (from $CONVEYOR_URL)" in stats.stdout
    assert PASSWORD not in log + stats.stdout + stats.stderr
    with conveyor.connect_sync(deployed) as store:
        assert [store.get(i).result for i in ids] == ["plain", "app"]  # type: ignore[union-attr]


def test_url_option_wins_over_conveyor_url(deployed: str, project: Path) -> None:
    elsewhere = f"sqlite:///{project / 'elsewhere.db'}"
    task_id = submitted_id(
        cli(
            *("submit", "echo", "--app", "rule_app:app", "--payload", '{"word": "w"}'),
            *("--json", "--url", deployed),
            cwd=project,
            conveyor_url=elsewhere,
        )
    )
    log = run_worker_until([task_id], deployed, project, "--url", deployed, conveyor_url=elsewhere)
    assert f"database {shown(deployed)}" in log and "(from" not in log.split("database")[1][:200]
    stats = cli("stats", "--url", deployed, cwd=project, conveyor_url=elsewhere)
    assert f"database {shown(deployed)} (from --url)" in stats.stdout
    assert not (project / "elsewhere.db").exists() and not (project / "hardcoded.db").exists()


def test_the_apps_url_then_the_default(project: Path) -> None:
    # No --url and no $CONVEYOR_URL: the App's URL for what loads the App, the
    # default file for what does not.
    task_id = submitted_id(
        cli(
            *("submit", "echo", "--app", "rule_app:app", "--payload", '{"word": "a"}', "--json"),
            cwd=project,
        )
    )
    hardcoded = f"sqlite:///{project / 'hardcoded.db'}"
    log = run_worker_until([task_id], hardcoded, project)
    assert "database sqlite:///hardcoded.db (from the App's URL)" in log
    assert not (project / "conveyor.db").exists()
    plain = cli("submit", "echo", "--json", cwd=project)
    submitted_id(plain)
    assert (project / "conveyor.db").exists()
    stats = cli("stats", cwd=project)
    assert "database sqlite:///conveyor.db (from the default" in stats.stdout
