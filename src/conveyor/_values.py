"""Checking and converting what callers pass in, before anything is written.

Every check raises :class:`InvalidArgument` naming the field; nothing here
touches the database.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
import traceback as tb
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, overload

from conveyor.errors import InvalidArgument
from conveyor.models import Backoff

MAX_NAME_LENGTH = 255
# Longest accepted duration: beyond it ``now + d`` overflows the stored microseconds
# (and Python's datetime), which the drivers would report as an opaque error.
MAX_DURATION = 100 * 366 * 86_400.0  # about a century
US = 1_000_000

Duration = int | float | timedelta


def duration_seconds(field: str, value: Any, *, allow_zero: bool = True) -> float:
    """Seconds from an ``int``/``float``/``timedelta``; rejects negatives, NaN, bools."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(
            field, f"must be seconds (int or float) or a timedelta, got {value!r}"
        )
    else:
        seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidArgument(field, f"must be a finite duration, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        # A timedelta's repr (days=-1, seconds=86395) hides its sign: show seconds.
        shown = f"{seconds:g} s" if isinstance(value, timedelta) else repr(value)
        raise InvalidArgument(field, f"must be {'>= 0' if allow_zero else '> 0'}, got {shown}")
    if seconds > MAX_DURATION:
        raise InvalidArgument(field, f"must be at most {MAX_DURATION:.0f} s (a century)")
    return seconds


def positive_int(field: str, value: Any, *, minimum: int = 1) -> int:
    """An ``int`` of at least ``minimum`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidArgument(field, f"must be >= {minimum}, got {value!r}")
    return value


def integer(field: str, value: Any) -> int:
    """Any ``int`` that fits a 32-bit column (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an integer, got {value!r}")
    if not -(2**31) <= value < 2**31:
        raise InvalidArgument(field, f"must fit in 32 bits, got {value!r}")
    return value


def opt_name(field: str, value: Any) -> str | None:
    """Like :func:`name`, but ``None`` passes through."""
    return None if value is None else name(field, value)


def name(field: str, value: Any) -> str:
    """A non-empty string of at most 255 characters."""
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string, got {value!r}")
    if not value:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(
            field, f"must be at most {MAX_NAME_LENGTH} characters, got {len(value)}"
        )
    return text(field, value)


def text(field: str, value: Any) -> str:
    """A string both databases can store: no NUL, no lone surrogates."""
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string, got {value!r}")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(field, "must be valid Unicode (no lone surrogates)") from None
    return value


def names(field: str, value: Any) -> list[str]:
    """One name or a non-empty sequence of names, deduplicated in order."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple | set | frozenset) or not value:
        raise InvalidArgument(
            field, f"must be a queue name or a non-empty list of them, got {value!r}"
        )
    out: list[str] = []
    for item in value:
        checked = name(field, item)
        if checked not in out:
            out.append(checked)
    return out


def to_json(field: str, value: Any, *, max_size: int | None = None) -> str:
    """Serialise ``value`` as strict JSON, or raise naming the field.

    Refused: what JSON cannot hold (NaN and infinities, bytes, sets, arbitrary
    objects, cycles, lone surrogates), dict keys that are not strings (JSON would
    turn ``1`` into ``"1"``, and ``{1: .., "1": ..}`` into one key), nesting deeper
    than :data:`MAX_DEPTH`, and an encoding longer than ``max_size`` bytes. What
    passes reads back equal, except that tuples come back as lists.
    """
    if value is None and (max_size is None or max_size >= 4):
        return "null"  # what most handlers return
    try:
        try:
            encoded = _encode(value)
        except RecursionError:
            # The quick encoder keeps no record of the containers it is inside, so a
            # cycle ends here too: the checking one tells a cycle from depth.
            encoded = _encode_checked(value)
        raw = encoded.encode("utf-8")  # lone surrogates serialise but no database stores them
    except RecursionError:
        raise InvalidArgument(field, f"is nested more than {MAX_DEPTH} levels deep") from None
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(field, f"must be JSON-serialisable ({exc})") from None
    if max_size is not None and len(raw) > max_size:
        raise InvalidArgument(
            field,
            f"is {len(raw)} bytes as JSON, over the limit of {max_size} bytes: store large "
            "data elsewhere and pass a reference (or raise the store's limit)",
        )
    if "{" in encoded or encoded.count("[") > MAX_DEPTH:
        _check_shape(field, value, 1)
    return encoded


# Deeper values are refused: reading them back (json.loads recurses) must never
# depend on how deep the caller's stack happens to be.
MAX_DEPTH = 100

# One encoder for every call: json.dumps with options builds a new one each time.
_CHECKED = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
_encode_checked = _CHECKED.encode


def _quick_encoder() -> Callable[[Any], str]:
    """The encoder :func:`to_json` calls first: the checking encoder's own C
    encoder, made once, without its record of the containers being encoded.

    Why: ``JSONEncoder.encode`` makes a new C encoder on every call, over half of
    what a small payload costs to encode (2.7 against 1.0 µs for ``{"i": 5}``;
    every submit pays it). Without the record a cycle runs into the recursion
    limit instead of being named, and :func:`to_json` then asks the checking
    encoder, so the error is the same. Where the interpreter has no C encoder,
    the checking one is used."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _encode_checked
    try:
        # The arguments JSONEncoder.iterencode passes it.
        quick = make(
            None,  # no record of open containers (cycles: see above)
            _CHECKED.default,
            json.encoder.encode_basestring,  # ensure_ascii=False, as the checking one
            None,  # indent
            _CHECKED.key_separator,
            _CHECKED.item_separator,
            False,  # sort_keys
            False,  # skipkeys
            False,  # allow_nan
        )
    except TypeError:  # another interpreter's signature: the checking one will do
        return _encode_checked

    def encode(value: Any) -> str:
        return "".join(quick(value, 0))

    return encode


_encode = _quick_encoder()
_NESTED = (dict, list, tuple)


def _check_shape(field: str, value: Any, depth: int) -> None:
    """String keys only, at most :data:`MAX_DEPTH` levels (``value`` encodes as JSON,
    so it is no deeper than the interpreter's recursion limit)."""
    if depth > MAX_DEPTH:
        raise InvalidArgument(field, f"is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, dict):
        for key, inner in value.items():
            if not isinstance(key, str):
                raise InvalidArgument(
                    field, f"dict keys must be strings, got {type(key).__name__} {key!r}"
                )
            if isinstance(inner, _NESTED):
                _check_shape(field, inner, depth + 1)
    elif isinstance(value, list | tuple):
        for inner in value:
            if isinstance(inner, _NESTED):
                _check_shape(field, inner, depth + 1)


def metadata(value: Any, *, max_size: int | None = None) -> str:
    """Metadata is a JSON object (dict with string keys)."""
    if value is None:
        return "{}"
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InvalidArgument(
            "metadata", f"must be a dict with string keys, got {type(value).__name__}"
        )
    return to_json("metadata", value, max_size=max_size)


#: Default cap on an encoded payload, metadata or result (``max_payload_size`` and
#: ``max_result_size`` of :func:`conveyor.connect`).
DEFAULT_MAX_SIZE = 1 << 20


def size_limit(field: str, value: Any) -> int | None:
    """A byte count for a size limit (``None``: no limit)."""
    if value is None:
        return None
    return positive_int(field, value)


def aware(field: str, value: Any) -> datetime:
    """An aware ``datetime``; naive ones are refused rather than guessed at."""
    if not isinstance(value, datetime):
        raise InvalidArgument(field, f"must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(field, "must be timezone-aware (e.g. datetime.now(UTC))")
    return value


def to_us(moment: datetime) -> int:
    """Microseconds since the epoch (how every time is stored)."""
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * US + delta.microseconds


@overload
def from_us(value: int) -> datetime: ...
@overload
def from_us(value: None) -> None: ...
def from_us(value: int | None) -> datetime | None:
    """The aware UTC datetime for stored microseconds (``None`` passes through)."""
    if value is None:
        return None
    if 0 <= value < _FLOAT_EXACT_US:
        # Twice as fast as the sum below, and exact: until 2106 a float holds the
        # seconds to within a quarter of a microsecond, and fromtimestamp rounds
        # to the nearest one.
        return datetime.fromtimestamp(value / 1_000_000, UTC)
    return EPOCH + timedelta(microseconds=value)


_FLOAT_EXACT_US = 2**32 * 1_000_000  # 2106-02-07, in microseconds since the epoch


def now_us() -> int:
    """The process clock in microseconds since the epoch."""
    return time.time_ns() // 1000


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def backoff(field: str, value: Any) -> Backoff | None:
    """A :class:`Backoff`, a dict of its fields, a fixed delay, or ``None``."""
    if value is None or isinstance(value, Backoff):
        return value
    if isinstance(value, int | float | timedelta) and not isinstance(value, bool):
        seconds = duration_seconds(field, value)
        return Backoff(base=seconds, factor=1.0, max=max(seconds, 1.0), jitter=0.0)
    if isinstance(value, dict):
        unknown = set(value) - {"base", "factor", "max", "jitter"}
        if unknown:
            raise InvalidArgument(field, f"unknown keys {sorted(unknown)}")
        parts = {k: duration_seconds(f"{field}.{k}", v) for k, v in value.items()}
        if parts.get("jitter", 0.0) > 1:
            raise InvalidArgument(field, "jitter must be within [0, 1]")
        return Backoff(**parts)
    raise InvalidArgument(field, f"must be a Backoff, a dict, or seconds, got {value!r}")


def backoff_delay(spec: dict[str, float] | None, attempt: int) -> float:
    """Seconds to wait before the retry that follows failed ``attempt``."""
    b = Backoff(**spec) if spec else Backoff()
    raw = b.base * b.factor ** max(attempt - 1, 0)
    delay = min(raw, b.max)
    return delay * (1.0 - b.jitter * random.random())


def error_envelope(error: Any, *, retryable: bool) -> dict[str, Any]:
    """The stored form of an error: ``{type, code, message, retryable, traceback}``."""
    if isinstance(error, BaseException):
        trace = "".join(tb.format_exception(type(error), error, error.__traceback__))
        return {
            "type": type(error).__name__,
            "code": getattr(error, "code", None) or "exception",
            "message": str(error),
            "retryable": retryable,
            "traceback": trace if error.__traceback__ is not None else None,
        }
    if isinstance(error, str):
        return {
            "type": "Error",
            "code": "error",
            "message": error,
            "retryable": retryable,
            "traceback": None,
        }
    if isinstance(error, dict):
        envelope = {
            "type": "Error",
            "code": "error",
            "message": "",
            "retryable": retryable,
            "traceback": None,
        }
        envelope.update(error)
        envelope["retryable"] = retryable
        to_json("error", envelope)
        return envelope
    raise InvalidArgument("error", f"must be an exception, a string or a dict, got {error!r}")


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Ten bits to two characters: a ULID's 130 bits are 13 lookups.
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
_id_lock = threading.Lock()
_id_last = [0, 0]  # last millisecond, last random part
# The time part of the ids of the last millisecond (10 characters), swapped whole.
_id_prefix: list[tuple[int, str]] = [(-1, "")]


def new_task_id() -> str:
    """A 26-character ULID: sortable by creation time, monotonic within a process."""
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _id_last[0]:
            ms = _id_last[0]
            rand = _id_last[1] + 1
        else:
            rand = int.from_bytes(os.urandom(10), "big") >> 1  # headroom for increments
        _id_last[0], _id_last[1] = ms, rand
    pairs = _PAIRS
    at, prefix = _id_prefix[0]
    if at != ms:
        # 48 bits of milliseconds in the first 10 characters (50 bits)
        prefix = "".join([pairs[(ms >> shift) & 1023] for shift in (40, 30, 20, 10, 0)])
        _id_prefix[0] = (ms, prefix)
    # 80 random bits in the last 16
    return (
        prefix
        + pairs[rand >> 70]
        + pairs[(rand >> 60) & 1023]
        + pairs[(rand >> 50) & 1023]
        + pairs[(rand >> 40) & 1023]
        + pairs[(rand >> 30) & 1023]
        + pairs[(rand >> 20) & 1023]
        + pairs[(rand >> 10) & 1023]
        + pairs[rand & 1023]
    )
