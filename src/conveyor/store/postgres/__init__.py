"""The PostgreSQL dialect: the seam (:mod:`.store`), its statements (:mod:`.texts`,
:mod:`.submit_texts`, :mod:`.keyed`, :mod:`.claim`), the kept driver connections
(:mod:`.direct`) and the wake channel (:mod:`.listen`)."""

from conveyor.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
