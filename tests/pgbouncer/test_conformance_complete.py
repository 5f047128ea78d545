"""tests/conformance/test_complete.py through PgBouncer, in both pool modes (this
folder's conftest makes its ``store`` and ``store_url`` go through it)."""

from test_complete import *  # noqa: F403
