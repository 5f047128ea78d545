"""tests/conformance/test_ack_many.py through PgBouncer, in both pool modes (this
folder's conftest makes its ``store`` and ``store_url`` go through it)."""

from test_ack_many import *  # noqa: F403
