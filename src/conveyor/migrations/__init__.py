"""Alembic migrations for the conveyor schema, shipped inside the package so that
opening a store (or ``conveyor migrate``) works from an installed wheel.

conveyor keeps its own revision history in its own version table
(``conveyor_alembic_version``), so it lives beside an application's Alembic
environment without touching it. An application that wants one ``alembic
upgrade head`` to do both calls :func:`upgrade` from its ``env.py``, and passes
:func:`include_name` to ``context.configure`` so that its autogenerate leaves
conveyor's tables alone. :func:`upgrade` acts only under ``alembic upgrade``:
the same ``env.py`` also runs for ``alembic revision --autogenerate``,
``check``, ``current``, ``stamp`` and ``downgrade``, which must not build
conveyor's tables as a side effect::

    from conveyor.migrations import include_name, upgrade as upgrade_conveyor

    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          include_name=include_name)
        with context.begin_transaction():
            context.run_migrations()
            upgrade_conveyor(connection)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

SCRIPT_LOCATION = str(Path(__file__).parent)
VERSION_TABLE = "conveyor_alembic_version"
#: The newest revision in ``versions/``; a store whose schema is at it opens without
#: loading Alembic. A new migration moves it (a test checks it is Alembic's head).
HEAD_REVISION = "0018"
TABLE_PREFIX = "conveyor_"


def upgrade(connection: Connection, revision: str = "head") -> bool:
    """Apply conveyor's migrations up to ``revision`` on ``connection``, inside the
    transaction it is in (an application's ``env.py`` calls this next to its own
    ``context.run_migrations()``). conveyor's history stays in its own version table.

    Called from an Alembic environment, it acts only when that environment runs
    for ``alembic upgrade`` (``command.upgrade``); for autogenerate, ``check``,
    ``current``, ``stamp``, ``downgrade`` or ``--sql`` it does nothing. Returns
    whether it ran conveyor's migrations."""
    from alembic import command
    from alembic import context as alembic_context
    from alembic.config import Config

    # Alembic keeps one module-level `context`; running conveyor's environment
    # inside the application's would leave the application's unset afterwards.
    outer = getattr(alembic_context, "_proxy", None)
    if outer is not None and not _applies_revisions(outer):
        return False
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.attributes["connection"] = connection
    try:
        command.upgrade(cfg, revision)
    finally:
        if outer is not None:
            outer._install_proxy()
    return True


def _applies_revisions(environment: Any) -> bool:
    """Whether an Alembic environment runs for an online ``upgrade``. Each Alembic
    command hands its environment the function that picks the revisions to run;
    ``command.upgrade``'s is named ``upgrade`` (autogenerate's and ``check``'s
    ``retrieve_migrations``, ``current``'s ``display_version``, and so on). Anything
    else, or a name Alembic may choose some day, leaves conveyor's tables alone:
    the store migrates itself on open, or ``conveyor migrate`` does."""
    opts = getattr(environment, "context_opts", {})
    if opts.get("as_sql"):
        return False  # offline: there is no database to upgrade, only a script
    picks = opts.get("fn")
    return getattr(picks, "__name__", None) == "upgrade" and getattr(
        picks, "__module__", ""
    ).startswith("alembic.")


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """For an application's ``context.configure(include_name=...)``: leave
    conveyor's tables (and its version table) out of the application's autogenerate."""
    return not (type_ == "table" and name is not None and name.startswith(TABLE_PREFIX))


__all__ = ["SCRIPT_LOCATION", "TABLE_PREFIX", "VERSION_TABLE", "include_name", "upgrade"]
