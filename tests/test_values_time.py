"""Stored microseconds to datetimes: the fast path is exact wherever it is taken."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from conveyor import _values as v

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_US = (datetime(1, 1, 1, tzinfo=UTC) - EPOCH) // timedelta(microseconds=1)
MAX_US = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - EPOCH) // timedelta(
    microseconds=1
)


@given(st.integers(min_value=MIN_US, max_value=MAX_US))
def test_from_us_is_exact_for_every_storable_microsecond(us: int) -> None:
    assert v.from_us(us) == EPOCH + timedelta(microseconds=us)


def test_from_us_at_the_edges() -> None:
    for us in (0, 1, 999_999, 1_000_000, 2**32 * 1_000_000 - 1, 2**32 * 1_000_000, -1, MAX_US):
        assert v.from_us(us) == EPOCH + timedelta(microseconds=us)
    assert v.from_us(None) is None
