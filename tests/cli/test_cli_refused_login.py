"""A URL naming a role or a database the server does not have fails at once with
the server's words, however long ``--wait-for-db`` is: the server answered, and
waiting will not change its answer. A server that does not answer is still
waited for. Against the real test server."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

import conveyor
from _support import ADMIN_URL
from conveyor import ConfigurationError, StoreUnavailable

EXIT_UNAVAILABLE = 4
APP = """
import conveyor

app = conveyor.App()

@app.task(name="noop", queue="refused")
def noop(ctx):
    return None
"""


@pytest.fixture
def server(pg_url: str) -> str:
    """The test server's admin URL (``pg_url`` skips, or fails in CI, without one)."""
    return ADMIN_URL


def _missing(server: str, what: str) -> tuple[str, str]:
    """A URL whose role (or database) does not exist, and the server's words for it."""
    name = f"conveyor_missing_{uuid.uuid4().hex[:8]}"
    if what == "role":
        return make_url(server).set(username=name).render_as_string(False), (
            f'role "{name}" does not exist'
        )
    return make_url(server).set(database=name).render_as_string(False), (
        f'database "{name}" does not exist'
    )


def worker(url: str, cwd: Path, wait: float) -> subprocess.CompletedProcess[str]:
    (cwd / "refused_app.py").write_text(textwrap.dedent(APP))
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_URL"}
    return subprocess.run(
        [
            *(sys.executable, "-m", "conveyor.cli", "worker", "refused_app:app"),
            *("--queues", "refused", "--url", url, "--wait-for-db", str(wait)),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        # Far below the wait asked for: a worker that waited would be killed here.
        timeout=90,
    )


@pytest.mark.parametrize("what", ["role", "database"])
def test_the_worker_does_not_wait_for_a_refused_login(
    server: str, what: str, tmp_path: Path
) -> None:
    url, words = _missing(server, what)
    proc = worker(url, tmp_path, wait=600)
    assert proc.returncode == EXIT_UNAVAILABLE, proc.stderr
    assert "waiting for the database" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert words in proc.stderr and "server refused the connection" in proc.stderr
    assert "fix the database URL" in proc.stderr


@pytest.mark.parametrize("what", ["role", "database"])
async def test_opening_a_store_names_the_refusal(server: str, what: str) -> None:
    url, words = _missing(server, what)
    store = conveyor.connect(url, listen=False)
    with pytest.raises(ConfigurationError) as info:
        await store.open()
    await store.close()
    assert words in str(info.value) and not isinstance(info.value, StoreUnavailable)
    assert "Fix the role, password or database name" in str(info.value)


def test_a_server_that_does_not_answer_is_still_waited_for(server: str, tmp_path: Path) -> None:
    # The test server's host, on a port nothing listens on.
    down = make_url(server).set(port=1).render_as_string(False)
    proc = worker(down, tmp_path, wait=2)
    assert proc.returncode == EXIT_UNAVAILABLE, proc.stderr
    assert "waiting for the database" in proc.stderr
    assert "did not answer within 2 s" in proc.stderr


@pytest.mark.parametrize(
    ("server_says", "refused"),
    [
        ('FATAL:  password authentication failed for user "app"', True),
        ('FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "app", database "jobs"', True),
        ('FATAL:  role "app" is not permitted to log in', True),
        ('FATAL:  permission denied for database "jobs"', True),
        ("fe_sendauth: no password supplied", True),
        ("FATAL:  the database system is starting up", False),
        ("FATAL:  sorry, too many clients already", False),
        ("Connection refused\n\tIs the server running on that host", False),
    ],
)
def test_which_answers_are_refusals(server_says: str, refused: bool) -> None:
    from conveyor.store.protocol.refusals import refused_login

    message = f'connection failed: connection to server at "h", port 5432 failed: {server_says}'
    words = refused_login(Exception(message))
    assert (words is not None) is refused
    if words is not None:
        assert words.startswith(server_says.removeprefix("FATAL:").split()[0])
