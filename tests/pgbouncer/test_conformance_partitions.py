"""tests/conformance/test_partitions.py through PgBouncer, in both pool modes (this
folder's conftest makes its ``store`` and ``store_url`` go through it)."""

from test_partitions import *  # noqa: F403
