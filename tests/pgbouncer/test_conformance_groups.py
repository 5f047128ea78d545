"""tests/conformance/test_groups.py through PgBouncer, in both pool modes (this
folder's conftest makes its ``store`` and ``store_url`` go through it)."""

from test_groups import *  # noqa: F403
