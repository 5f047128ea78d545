"""The SQLite dialect: the seam (:mod:`.store`), its statements (``sql/*.sql``, some
of them scripts), its claim hook (:mod:`.claim`), how its connections are made and
begun (:mod:`.connection`) and the connection thread that runs whole transactions
(:mod:`.thread`)."""

from conveyor.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
