"""libpq multi-host URLs (``postgresql://u@h1:p1,h2:p2/db?target_session_attrs=...``):
read as SQLAlchemy's ``?host=`` form, shown as written, and used by every
connection a store makes, its LISTEN connection included."""

from __future__ import annotations

import asyncio
import socket

import pytest
from sqlalchemy.engine import make_url

import conveyor
from conveyor import ConfigurationError
from conveyor.connect import display_url, resolve_url


def _multihost(pg_url: str, attrs: str = "read-write") -> str:
    """``pg_url`` behind a first host where nothing listens."""
    parsed = make_url(pg_url)
    with socket.socket() as sock:  # a port nothing listens on (bound, never listening)
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    return (
        f"postgresql://{parsed.username}@127.0.0.1:{dead},{parsed.host}:{parsed.port or 5432}"
        f"/{parsed.database}?target_session_attrs={attrs}"
    )


def test_the_libpq_form_becomes_sqlalchemys() -> None:
    dialect, url = resolve_url(
        "postgresql://app:pw@10.0.0.1:5432,10.0.0.2:5433,db3/jobs?target_session_attrs=read-write"
    )
    assert dialect == "postgresql"
    parsed = make_url(url)
    assert parsed.drivername == "postgresql+psycopg"
    assert parsed.query["host"] == ("10.0.0.1:5432", "10.0.0.2:5433", "db3")
    assert parsed.query["target_session_attrs"] == "read-write"
    assert (parsed.username, parsed.password, parsed.database) == ("app", "pw", "jobs")
    # SQLAlchemy's own form is taken as it is
    same = "postgresql+psycopg://app@/jobs?host=10.0.0.1:5432&host=10.0.0.2:5433"
    assert make_url(resolve_url(same)[1]).query["host"] == ("10.0.0.1:5432", "10.0.0.2:5433")


def test_multihost_urls_are_shown_as_written_without_the_password() -> None:
    shown = display_url("postgresql+psycopg://app:secret@h1:5432,h2:5432/jobs?x=1")
    assert shown == "postgresql://app:***@h1:5432,h2:5432/jobs?x=1"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://u@[::1]:5432,h2:5432/db", "name:port"),
        ("postgresql://u@h1:5432,,h2/db", "name:port"),
        ("postgresql://u@h1,h2/db?host=h3", "one way"),
        ("postgresql://u@h1:port/db", "cannot parse"),
    ],
)
def test_bad_host_lists_are_refused(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        conveyor.connect(url)


async def test_a_store_and_its_listener_reach_the_server_past_a_dead_host(pg_url: str) -> None:
    url = _multihost(pg_url)
    async with conveyor.connect(url) as st:
        queue = "multihost"
        task = await st.submit("t", queue=queue)
        [got] = await st.claim(queue, worker_id="w")
        assert got.id == task.id
        await st.succeed(got.id, worker_id="w", attempt=got.attempt)
        # the wake-up listener connected through the same host list
        await st.wait_for_work([queue], 0.01)
        listener = st._listener  # type: ignore[attr-defined]
        for _ in range(100):
            if listener is not None and listener.listening:
                break
            await asyncio.sleep(0.05)
        assert listener is not None and listener.listening
