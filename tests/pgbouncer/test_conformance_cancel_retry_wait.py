"""tests/conformance/test_cancel_retry_wait.py through PgBouncer, in both pool modes (this
folder's conftest makes its ``store`` and ``store_url`` go through it)."""

from test_cancel_retry_wait import *  # noqa: F403
