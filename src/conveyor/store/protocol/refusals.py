"""What opening a store refuses to wait for or to build on.

* A login the server turned down (a role or a database that does not exist, a
  password or a ``pg_hba.conf`` rule that does not match): the server answered,
  so waiting for it (``--wait-for-db``) cannot help; :func:`refused_login` tells
  these apart from a server that is down or still starting.
* a pooler refusing the startup parameters of a store not told of it
  (:func:`refused_by_pooler`): the fix is an option, not a wait;
* conveyor tables with no revision recorded in conveyor's version table: they
  were made outside conveyor's migrations, so no migration can be applied on top
  of them; :func:`check_unrecorded_tables` says so instead of letting the first
  ``CREATE TABLE`` fail.
"""

from __future__ import annotations

import re

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from conveyor.errors import ConfigurationError
from conveyor.migrations import VERSION_TABLE
from conveyor.schema import metadata

# libpq passes on the server's startup error as text only (no SQLSTATE), so these
# are PostgreSQL's own words (SQLSTATE 28000, 28P01, 3D000, 42501), in English. A
# server set to another language for its messages is not recognised here and is
# waited for, as before: a slower failure, never a wrong one.
_REFUSED = re.compile(
    r'role ".*" does not exist'
    r'|database ".*" does not exist'
    r"|password authentication failed"
    r"|\w+ authentication failed for user"
    r"|no pg_hba\.conf entry"
    r"|is not permitted to log in"
    r"|permission denied for database"
    r"|no password supplied"
)
# What psycopg and libpq put before the server's words: 'connection failed:
# connection to server at "h", port 5432 failed: FATAL:  ' (or 'on socket "..."
# failed:'); up to the last "failed:", which none of the words above contains.
_PREFIX = re.compile(r"^.*\bfailed:\s*(?:FATAL:\s*)?", re.DOTALL)


def refused_login(exc: BaseException) -> str | None:
    """The server's own words when ``exc`` is a login it refused, else None (the
    server did not answer, is starting up, or refused for a passing reason such as
    too many connections: those are worth waiting for)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    text = " ".join(str(orig).split())
    if _REFUSED.search(text) is None:
        return None
    return _PREFIX.sub("", text, count=1) or text


# PgBouncer's words for a startup parameter it does not pass on: the store sets
# its timeouts with the ``options`` startup parameter unless told of a pooler.
_POOLER_REFUSED = re.compile(r"unsupported startup parameter: (\w+)")


def refused_by_pooler(exc: BaseException) -> str | None:
    """How to fix a connection a pooler refused for its startup parameters (a store
    opened without ``pooler=`` in front of PgBouncer), else None."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    found = _POOLER_REFUSED.search(" ".join(str(orig).split()))
    if found is None:
        return None
    return (
        f"the server (a connection pooler, such as PgBouncer) refused the startup "
        f"parameter {found.group(1)!r}: tell conveyor it is behind a pooler with "
        "?pooler=transaction (or ?pooler=session, as the pooler's pool_mode) in the URL, "
        "or pooler= given to connect()"
    )


def check_unrecorded_tables(conn: Connection) -> None:
    """Raise :class:`ConfigurationError` when conveyor's tables exist but conveyor's
    version table records no revision (called before migrating a database that
    seems to have no conveyor schema)."""
    present = set(sa_inspect(conn).get_table_names())
    ours = sorted(present & (set(metadata.tables) - {VERSION_TABLE}))
    if not ours:
        return
    shown = ", ".join(ours[:3]) + (f" and {len(ours) - 3} more" if len(ours) > 3 else "")
    raise ConfigurationError(
        f"the database has conveyor tables ({shown}) but {VERSION_TABLE} records no "
        "revision: they were made outside conveyor's migrations (for instance by an "
        "application's Alembic autogenerate that ran conveyor's upgrade), so conveyor "
        "cannot tell which version they are. If they hold nothing you need, drop the "
        f"conveyor_* tables (and {VERSION_TABLE}) and run `conveyor migrate`"
    )
