"""The checkout's alembic environment: the one shipped in the package."""

from conveyor.migrations import env  # noqa: F401  (runs the migrations on import)
