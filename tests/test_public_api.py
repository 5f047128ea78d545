"""The public surface: exported names, errors and their codes, URL rules (SPEC §2, §4).

None of these tests opens a database.
"""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

import conveyor
from conveyor import (
    AlreadyExists,
    ConfigurationError,
    ConveyorError,
    DecryptionError,
    InvalidArgument,
    LostLease,
    MigrationRequired,
    NotFound,
    ProtocolVersionMismatch,
    QueueFull,
    Status,
    StoreError,
    StoreUnavailable,
    TaskCancelled,
)
from conveyor.store.postgres import PostgresStore
from conveyor.store.sqlite import SQLiteStore

EXPORTS = [
    "AlreadyExists",
    "App",
    "Backoff",
    "Batch",
    "BatchInfo",
    "ConfigurationError",
    "ConsumerGroup",
    "Context",
    "ConveyorError",
    "DecryptionError",
    "Encryption",
    "GroupStats",
    "InvalidArgument",
    "LostLease",
    "MigrationRequired",
    "NotFound",
    "Page",
    "Permanent",
    "ProtocolVersionMismatch",
    "QueueFull",
    "QueueStats",
    "Rate",
    "SeekResult",
    "Snooze",
    "Status",
    "StoreError",
    "StoreUnavailable",
    "SyncStore",
    "Task",
    "TaskCancelled",
    "TaskStore",
    "__version__",
    "connect",
    "connect_sync",
]

CODES: dict[type[ConveyorError], str] = {
    ConfigurationError: "configuration",
    InvalidArgument: "invalid_argument",
    AlreadyExists: "already_exists",
    QueueFull: "queue_full",
    LostLease: "lost_lease",
    TaskCancelled: "task_cancelled",
    MigrationRequired: "migration_required",
    ProtocolVersionMismatch: "protocol_version_mismatch",
    NotFound: "not_found",
    StoreUnavailable: "store_unavailable",
    StoreError: "store_error",
    DecryptionError: "decryption",
}


def test_all_is_pinned() -> None:
    assert sorted(conveyor.__all__) == sorted(EXPORTS)
    assert len(conveyor.__all__) == len(set(conveyor.__all__))
    for name in conveyor.__all__:
        assert hasattr(conveyor, name), name


def test_status_values() -> None:
    assert [s.value for s in Status] == [
        "queued",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "evicted",
        "skipped",
        "waiting",
    ]
    assert not Status.WAITING.terminal
    assert isinstance(Status.QUEUED, str)
    assert Status("failed") is Status.FAILED
    assert str(Status.SUCCEEDED) == "succeeded"
    assert "succeeded" in {Status.SUCCEEDED}  # hashes and compares as its string


@pytest.mark.parametrize("cls", list(CODES), ids=lambda c: c.__name__)
def test_every_error_has_a_stable_code(cls: type[ConveyorError]) -> None:
    assert issubclass(cls, ConveyorError)
    assert issubclass(cls, Exception)
    assert cls.code == CODES[cls]


def test_codes_are_distinct() -> None:
    assert len(set(CODES.values())) == len(CODES)
    assert ConveyorError.code not in CODES.values()


def test_error_hierarchy() -> None:
    assert issubclass(InvalidArgument, ValueError)
    assert issubclass(TaskCancelled, LostLease)
    exc = InvalidArgument("lease", "must be > 0")
    assert exc.field == "lease" and "lease" in str(exc)
    taken = AlreadyExists("k", "01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert (taken.key, taken.task_id) == ("k", "01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert TaskCancelled("abc").code == "task_cancelled"
    assert issubclass(MigrationRequired, ConfigurationError)
    behind = MigrationRequired(("0007",), "0008", "run `conveyor migrate`")
    assert (behind.current, behind.head) == (("0007",), "0008")
    assert LostLease("abc").task_id == "abc"


@pytest.mark.parametrize(
    ("url", "cls"),
    [
        ("sqlite:///some/where.db", SQLiteStore),
        ("sqlite+aiosqlite:///some/where.db", SQLiteStore),
        ("sqlite://", SQLiteStore),
        ("postgresql://user@db.invalid/app", PostgresStore),
        ("postgresql+psycopg://user@db.invalid/app", PostgresStore),
    ],
)
def test_connect_maps_urls_to_stores(url: str, cls: type[conveyor.TaskStore]) -> None:
    store = conveyor.connect(url)  # no I/O: an unreachable host is fine here
    assert type(store) is cls
    assert isinstance(store, conveyor.TaskStore)
    assert make_url(store.url).database == make_url(url).database


def test_connect_sync_wraps_the_same_store() -> None:
    sync = conveyor.connect_sync("sqlite:///x.db")
    assert isinstance(sync, conveyor.SyncStore)
    assert isinstance(sync.store, SQLiteStore)


@pytest.mark.parametrize(
    "url", ["mysql://x", "mysql+pymysql://u@h/db", "oracle://h/db", "sqlite+pysqlite:///x.db"]
)
def test_connect_refuses_other_schemes(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        conveyor.connect(url)
    assert info.value.code == "configuration"
    with pytest.raises(ConfigurationError):
        conveyor.connect_sync(url)


def test_connect_refuses_garbage() -> None:
    with pytest.raises(ConfigurationError):
        conveyor.connect("not a url at all")


def test_default_url_is_a_local_sqlite_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONVEYOR_URL", raising=False)
    store = conveyor.connect()
    assert type(store) is SQLiteStore
    url = make_url(store.url)
    assert url.get_backend_name() == "sqlite"
    assert url.database == "conveyor.db"


def test_default_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_URL", "postgresql://someone@db.invalid/jobs")
    store = conveyor.connect()
    assert type(store) is PostgresStore
    assert make_url(store.url).database == "jobs"
    monkeypatch.setenv("CONVEYOR_URL", "sqlite:///from-env.db")
    assert make_url(conveyor.connect().url).database == "from-env.db"
    monkeypatch.setenv("CONVEYOR_URL", "mysql://x")
    with pytest.raises(ConfigurationError):
        conveyor.connect()


def test_explicit_url_beats_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_URL", "postgresql://someone@db.invalid/jobs")
    store = conveyor.connect("sqlite:///explicit.db")
    assert type(store) is SQLiteStore


def test_postgres_without_psycopg_names_the_install_command() -> None:
    """A real interpreter in which psycopg cannot be imported, as on a core install."""
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import conveyor\n"
        "try:\n"
        "    conveyor.connect('postgresql://user@127.0.0.1/db')\n"
        "except conveyor.ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "pip install 'conveyor[postgres]'" in out
