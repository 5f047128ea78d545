"""``App`` follows the one URL rule: ``$CONVEYOR_URL``, else the App's own URL,
else ``sqlite:///conveyor.db``; a ``url=`` given to the worker wins over both.
No database is opened here."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

import conveyor
from conveyor.connect import choose_url, display_url


def database_of(store: conveyor.TaskStore | conveyor.SyncStore) -> str | None:
    inner = store.store if isinstance(store, conveyor.SyncStore) else store
    return make_url(inner.url).database


def test_conveyor_url_wins_over_the_apps_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_URL", "sqlite:///from-env.db")
    app = conveyor.App("sqlite:///from-code.db")
    assert app.database() == ("sqlite:///from-env.db", "env")
    assert database_of(app.store) == "from-env.db"
    assert database_of(app.sync_store) == "from-env.db"
    assert app.database("sqlite:///given.db") == ("sqlite:///given.db", "given")
    worker = app.worker("q")
    assert worker.database_origin == "$CONVEYOR_URL"


def test_the_apps_url_then_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONVEYOR_URL", raising=False)
    app = conveyor.App("sqlite:///from-code.db")
    assert app.database().origin == "app"
    assert database_of(app.store) == "from-code.db"
    assert app.worker("q").database_origin == "the App's URL"
    assert conveyor.App().database() == ("sqlite:///conveyor.db", "default")
    # A store handed to the worker says nothing about where its URL came from.
    assert app.worker("q", store=conveyor.connect("sqlite:///x.db")).database_origin is None


def test_connect_keeps_an_explicit_url(monkeypatch: pytest.MonkeyPatch) -> None:
    # connect(url) is a store for exactly that URL: tests and tools pin theirs.
    monkeypatch.setenv("CONVEYOR_URL", "sqlite:///from-env.db")
    assert database_of(conveyor.connect("sqlite:///pinned.db")) == "pinned.db"
    assert choose_url(None, "sqlite:///app.db").origin == "env"


def test_urls_are_shown_without_password_or_driver() -> None:
    assert display_url("postgresql+psycopg://u:hunter2@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert display_url("sqlite+aiosqlite:///x.db") == "sqlite:///x.db"
