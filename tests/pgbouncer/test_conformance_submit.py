"""tests/conformance/test_submit.py through PgBouncer, in both pool modes (this
folder's conftest makes its ``store`` and ``store_url`` go through it)."""

from test_submit import *  # noqa: F403
