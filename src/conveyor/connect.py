"""Opening a store from a URL: :func:`connect`, :func:`connect_sync` and the URL
rules they share (:func:`choose_url`, :func:`resolve_url`).

Importing this module is cheap (no SQLAlchemy): the CLI's ``--help`` and the
package's own import go through it. SQLAlchemy and the store classes are
imported by the calls that need them; the blocking facade lives in
:mod:`conveyor.sync_store`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

from conveyor.errors import ConfigurationError

if TYPE_CHECKING:
    from conveyor.store.base import TaskStore
    from conveyor.sync_store import SyncStore

DEFAULT_URL = "sqlite:///conveyor.db"
POSTGRES_INSTALL = "pip install 'conveyor[postgres]'"


#: The environment variable that names the database.
URL_VARIABLE = "CONVEYOR_URL"
#: The environment variable naming a streaming replica for reads (Postgres).
READ_URL_VARIABLE = "CONVEYOR_READ_URL"
#: The options of :func:`connect` that only a PostgreSQL server has; refused for
#: SQLite (``None`` is accepted: a caller passing options through unconditionally).
POSTGRES_ONLY = ("pooler", "listen_url", "read_url")


class ChosenUrl(NamedTuple):
    """The database URL a command, a worker or an App uses, and where it came from:
    ``"given"`` (``--url``, a ``url=`` argument), ``"env"`` (``$CONVEYOR_URL``),
    ``"app"`` (the URL given to :class:`~conveyor.App`) or ``"default"``."""

    url: str
    origin: str


def choose_url(given: str | None = None, app: str | None = None) -> ChosenUrl:
    """The one precedence rule every command, worker and App follows: a URL given
    for this very call (``--url``, ``url=``) first, then ``$CONVEYOR_URL``, then
    the App's own URL, then ``sqlite:///conveyor.db``.

    ``$CONVEYOR_URL`` comes before the App's URL so that what the deployment says
    wins over what the code says, and so that the commands that load no App
    (``conveyor submit``, ``list``, ``stats``) and those that do (``worker``,
    ``submit --app``) always reach the same database."""
    if given:
        return ChosenUrl(given, "given")
    env = os.environ.get(URL_VARIABLE)
    if env:
        return ChosenUrl(env, "env")
    if app:
        return ChosenUrl(app, "app")
    return ChosenUrl(DEFAULT_URL, "default")


def _split_hosts(url: str) -> tuple[str, str, list[str], str, str] | None:
    """``(scheme, userinfo, hosts, path, query)`` of a URL whose host part lists
    several ``host[:port]`` separated by commas (libpq's multi-host form), else None."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    authority, slash, tail = rest.partition("/")
    if not slash:
        authority, _, query = authority.partition("?")
        path = ""
    else:
        path, _, query = tail.partition("?")
    userinfo, at, hostlist = authority.rpartition("@")
    if "," not in hostlist:
        return None
    return scheme, userinfo + at, hostlist.split(","), path, query


def _multihost(url: str) -> str:
    """A libpq multi-host URL (``postgresql://u@h1:p1,h2:p2/db?...``) in the form
    SQLAlchemy's psycopg dialect reads (``postgresql://u@/db?host=h1:p1&host=h2:p2&...``,
    which it hands back to libpq as ``host=h1,h2 port=p1,p2``); any other URL as given."""
    split = _split_hosts(url)
    if split is None:
        return url
    from urllib.parse import parse_qsl, quote

    scheme, userinfo, hosts, path, query = split
    for host in hosts:
        if not host or host.startswith("[") or host.count(":") > 1:
            raise ConfigurationError(
                f"cannot read the host list {','.join(hosts)!r} of the database URL: give "
                "each host as name:port or address:port separated by commas (IPv6 "
                "addresses: use a host name, or the ?host=...&port=... query form)"
            )
    if any(key == "host" for key, _ in parse_qsl(query)):
        raise ConfigurationError(
            "the database URL lists hosts both before the database name and as ?host=: "
            "give them one way"
        )
    listed = "&".join(f"host={quote(host, safe=':')}" for host in hosts)
    return f"{scheme}://{userinfo}/{path}?{listed}{'&' + query if query else ''}"


def display_url(url: str) -> str:
    """``url`` as shown to people: the password masked, the driver left out
    (``sqlite+aiosqlite://`` shows as ``sqlite://``)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    split = _split_hosts(url)
    if split is not None:  # a multi-host URL: shown as written, with its hosts
        scheme, userinfo, hosts, path, query = split
        user, colon, _ = userinfo.rstrip("@").partition(":")
        shown_user = f"{user}{':***' if colon else ''}@" if userinfo else ""
        return (
            f"{scheme.partition('+')[0]}://{shown_user}{','.join(hosts)}/{path}"
            f"{'?' + query if query else ''}"
        )
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return url
    backend = parsed.drivername.partition("+")[0]
    return parsed.set(drivername=backend).render_as_string(hide_password=True)


def resolve_url(url: str | None) -> tuple[str, str]:
    """``(dialect, async SQLAlchemy URL)`` for a user's URL, or ConfigurationError.

    A PostgreSQL URL may list several servers the way libpq does,
    ``postgresql://user@host1:5432,host2:5432/db?target_session_attrs=read-write``:
    each connection goes to the first of them that is up and (with
    ``target_session_attrs=read-write``) the primary, so a store follows a failover.
    It becomes SQLAlchemy's own form of the same list (``?host=host1:5432&host=...``),
    which is accepted too."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    raw = choose_url(url).url
    try:
        parsed = make_url(_multihost(raw))
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigurationError(
            f"cannot parse the database URL {display_url(raw)!r}: use sqlite:///path.db "
            "or postgresql://user@host/db (several hosts: postgresql://user@host1:port1,"
            "host2:port2/db?target_session_attrs=read-write)"
        ) from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite" and driver in ("", "aiosqlite"):
        return "sqlite", parsed.set(drivername="sqlite+aiosqlite").render_as_string(False)
    if backend in ("postgresql", "postgres") and driver in ("", "psycopg", "psycopg_async"):
        try:
            import psycopg  # noqa: F401  (only to learn whether the extra is installed)
        except ImportError:
            raise ConfigurationError(
                f"PostgreSQL needs the psycopg driver: run `{POSTGRES_INSTALL}`"
            ) from None
        return "postgresql", parsed.set(drivername="postgresql+psycopg").render_as_string(False)
    raise ConfigurationError(
        f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:// "
        "(or sqlite+aiosqlite://) or postgresql:// (or postgresql+psycopg://)"
    )


def connect(url: str | None = None, **options: Any) -> TaskStore:
    """A store for ``url`` (default ``$CONVEYOR_URL``, else ``sqlite:///conveyor.db``).

    No I/O happens here; ``async with store`` (or the first call) opens it.
    Options: ``migrate`` (default True), ``statement_timeout``, ``lock_timeout``,
    ``poll_interval``, ``engine_options``, ``max_payload_size`` and
    ``max_result_size`` (bytes of JSON, default 1 MiB, ``None`` for no limit);
    SQLite also ``busy_timeout`` and ``synchronous``; Postgres also ``listen`` and
    ``timeouts`` (``"connection"``, the default: the timeouts are set once per
    connection; ``"transaction"``: in every transaction, for a transaction-mode
    pooler such as PgBouncer) and ``durable_claims`` (default False: a claim's
    commit does not wait for the WAL flush, so a server crash may forget a lease
    and the task runs again; True waits, like every other write) and
    ``direct_connections`` (default 10: the most connections, beyond the pool,
    kept in autocommit for statements that run by themselves; two stay open, the
    others only while that many such statements run at once). ``gc_freeze``
    (default False): True makes the store's first open collect garbage once and
    freeze what is alive (``gc.freeze()``, once per process), as a worker's start
    does, so the collector's full passes stop walking every module loaded; a
    producer that submits much may want it, the default leaves the collector alone.
    ``encryption`` (a :class:`conveyor.Encryption`): the keys of encryption at
    rest; without it, those of ``$CONVEYOR_ENCRYPTION_KEYS`` (``id=base64key,...``,
    the first one current), if set.

    Postgres behind PgBouncer: ``pooler="transaction"`` or ``"session"`` (its
    ``pool_mode``; or ``?pooler=transaction`` in the URL, so ``$CONVEYOR_URL``
    carries it). ``listen_url`` (default ``$CONVEYOR_LISTEN_URL``): a direct
    connection to the same database for ``LISTEN``, which a transaction-mode
    pooler cannot carry (without it such a store polls, and logs so once).
    ``read_url`` (default ``$CONVEYOR_READ_URL``): a streaming replica that
    ``list``, ``stats``, ``groups``, ``workers``, ``streams``, ``throughput`` and
    the other inspection reads (hence the dashboard and the metrics) go to;
    ``get()`` and ``wait()`` stay on the primary unless ``get(..., replica=True)``.
    """
    dialect, async_url = resolve_url(url)
    if dialect == "sqlite":
        from conveyor.errors import InvalidArgument
        from conveyor.store.sqlite import SQLiteStore

        for field in POSTGRES_ONLY:
            if options.get(field) is not None:
                raise InvalidArgument(field, "is a PostgreSQL option; SQLite has no server")
            options.pop(field, None)

        return SQLiteStore(async_url, **options)
    from conveyor.store.postgres import PostgresStore

    return PostgresStore(async_url, **options)


def connect_sync(url: str | None = None, **options: Any) -> SyncStore:
    """A blocking store for ``url``; same options as :func:`connect`."""
    from conveyor.sync_store import SyncStore

    return SyncStore(connect(url, **options))


def __getattr__(name: str) -> Any:
    # SyncStore (and SyncInternal) lived here; importing them from here still works
    # (and costs SQLAlchemy).
    if name in ("SyncStore", "SyncInternal"):
        from conveyor import sync_store

        return getattr(sync_store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
