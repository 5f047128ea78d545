"""tests/conformance/test_claim.py through PgBouncer, in both pool modes (this
folder's conftest makes its ``store`` and ``store_url`` go through it)."""

from test_claim import *  # noqa: F403
