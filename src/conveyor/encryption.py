"""Encryption at rest: the keys a store seals and opens values with.

A queue set ``encrypt=True`` (:meth:`~conveyor.store.base.TaskStore.configure_queue`)
has the payload, the metadata, the result, the error and the progress message of
each of its tasks stored sealed with AES-256-GCM: a fresh 96-bit nonce per value,
the key's id stored beside the ciphertext, and the task's id and the value's
field bound as associated data, so a ciphertext copied to another row or column
does not open. The sealing and opening happen in Python, in the store's
protocol; the database only ever holds text of the form::

    ~c1:<key id>:<base64 of nonce + ciphertext + tag>

(``~`` never starts JSON, so a sealed value is never taken for a plain one.)

The keys come from :class:`Encryption`, given to :func:`conveyor.connect`, or
from ``$CONVEYOR_ENCRYPTION_KEYS`` (``id1=base64key1,id2=base64key2``, the
first one current) when no ``encryption=`` is given.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor.errors import ConfigurationError, DecryptionError, InvalidArgument

#: The environment variable holding the keys: ``id1=base64key1,id2=base64key2``,
#: the first one current.
KEYS_VARIABLE = "CONVEYOR_ENCRYPTION_KEYS"
#: What every sealed value starts with (version 1 of the format).
MARK = "~c1:"
KEY_BYTES = 32
NONCE_BYTES = 12
_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
CRYPTO_INSTALL = "pip install 'conveyor[crypto]'"


class Encrypted:
    """What a value that this store cannot open reads as where a dashboard asked
    for sealed values to be shown rather than refused (``str()``: ``"encrypted"``).
    There is one, :data:`ENCRYPTED`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<encrypted>"

    def __str__(self) -> str:
        return "encrypted"

    def __bool__(self) -> bool:
        return True


#: The one :class:`Encrypted` value.
ENCRYPTED = Encrypted()


def _key_bytes(key_id: str, key: Any) -> bytes:
    """``key`` (32 bytes, or the base64 text of 32 bytes) as bytes, or
    InvalidArgument naming the key id."""
    if isinstance(key, bytes | bytearray) and len(key) == KEY_BYTES:
        return bytes(key)
    if isinstance(key, bytes | bytearray | str):
        try:
            raw = base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) == KEY_BYTES:
            return raw
    raise InvalidArgument(
        f"keys[{key_id!r}]",
        f"must be {KEY_BYTES} bytes or the base64 text of {KEY_BYTES} bytes "
        '(make one with: python -c "import base64, os; '
        'print(base64.b64encode(os.urandom(32)).decode())")',
    )


@dataclass(frozen=True)
class Encryption:
    """The keys of a store: ``keys`` maps a key id to a 32-byte key (or the
    base64 text of one); ``current`` names the one new values are sealed with.
    The others keep opening what was sealed with them until ``conveyor rekey``
    has sealed it again under the current one.

    Key ids are 1-64 letters, digits, ``.``, ``_`` or ``-`` (a date such as
    ``"2026-12"`` does well). Checked when made: a bad key raises
    :class:`~conveyor.InvalidArgument` naming its id."""

    keys: Mapping[str, bytes | str]
    current: str
    _raw: dict[str, bytes] = field(init=False, repr=False, compare=False)
    #: One AES-GCM cipher per key, made once: making one costs as much as sealing.
    _ciphers: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.keys, Mapping) or not self.keys:
            raise InvalidArgument("keys", "must map at least one key id to a key")
        raw: dict[str, bytes] = {}
        for key_id, key in self.keys.items():
            if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
                raise InvalidArgument(
                    "keys",
                    f"key id {key_id!r} must be 1-64 letters, digits, '.', '_' or '-'",
                )
            raw[key_id] = _key_bytes(key_id, key)
        if self.current not in raw:
            raise InvalidArgument(
                "current", f"names no key of keys: {self.current!r} (keys: {', '.join(raw)})"
            )
        # The keys as bytes, read-only (the mapping given may change later).
        object.__setattr__(self, "keys", types.MappingProxyType(dict(raw)))
        object.__setattr__(self, "_raw", raw)
        aead = _aead()  # the cryptography package is there, or a clear error now
        object.__setattr__(self, "_ciphers", {key_id: aead(key) for key_id, key in raw.items()})

    def __hash__(self) -> int:
        return hash((self.current, tuple(sorted(self._raw.items()))))

    def __repr__(self) -> str:  # never the keys themselves
        return f"Encryption(keys=[{', '.join(map(repr, self._raw))}], current={self.current!r})"

    @classmethod
    def from_env(cls, value: str | None = None) -> Encryption | None:
        """The keys of ``$CONVEYOR_ENCRYPTION_KEYS`` (or of ``value`` in its
        format: ``id1=base64key1,id2=base64key2``, the first one current);
        ``None`` when it is unset or empty. A malformed value raises
        :class:`~conveyor.ConfigurationError` naming the variable and the key id."""
        text = os.environ.get(KEYS_VARIABLE, "") if value is None else value
        if not text.strip():
            return None
        keys: dict[str, str] = {}
        for n, part in enumerate(p.strip() for p in text.split(",")):
            key_id, sep, key = part.partition("=")
            if not sep or not key_id.strip():
                raise ConfigurationError(
                    f"${KEYS_VARIABLE}: entry {n + 1} must be id=base64key "
                    "(entries separated by commas, the first one current)"
                )
            keys[key_id.strip()] = key.strip()
        try:
            return cls(keys=keys, current=next(iter(keys)))
        except InvalidArgument as exc:
            raise ConfigurationError(f"${KEYS_VARIABLE}: {exc}") from None

    def key_ids(self) -> tuple[str, ...]:
        """The ids of the keys, the current one first."""
        return (self.current, *(k for k in self._raw if k != self.current))

    def seal(self, text: str, *, task_id: str, field: str) -> str:
        """``text`` sealed under the current key, bound to the task ``task_id`` and
        the value's ``field`` (``"payload"``, ``"result"``, ...)."""
        nonce = os.urandom(NONCE_BYTES)
        sealed: bytes = self._ciphers[self.current].encrypt(
            nonce, text.encode(), _bound(task_id, field)
        )
        return f"{MARK}{self.current}:{base64.b64encode(nonce + sealed).decode()}"

    def open(self, text: str, *, task_id: str, field: str) -> str:
        """The plain text of a value :meth:`seal` made for ``task_id`` and
        ``field``; :class:`~conveyor.DecryptionError` if this store has no key of
        its id or the value does not open (another row's, altered, another key)."""
        key_id = key_of(text)
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise DecryptionError(task_id, key_id, f"this store has no key {key_id!r}")
        body = text[len(MARK) + len(key_id) + 1 :]
        try:
            blob = base64.b64decode(body, validate=True)
            plain: bytes = cipher.decrypt(
                blob[:NONCE_BYTES], blob[NONCE_BYTES:], _bound(task_id, field)
            )
        except Exception:  # InvalidTag, bad base64, a blob too short
            raise DecryptionError(
                task_id, key_id, f"its {field} does not open with key {key_id!r}"
            ) from None
        return plain.decode()


def is_sealed(text: str | None) -> bool:
    """Whether a stored value is sealed (see the module docs)."""
    return text is not None and text.startswith(MARK)


def key_of(text: str) -> str:
    """The id of the key a sealed value was sealed with."""
    return text[len(MARK) :].partition(":")[0]


def _bound(task_id: str, field: str) -> bytes:
    """The associated data of a value: its task and its field."""
    return f"conveyor:{task_id}:{field}".encode()


def _aead() -> Any:
    """The AES-GCM class of the ``cryptography`` package (the ``crypto`` extra)."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ConfigurationError(
            f"encryption at rest needs the cryptography package: run `{CRYPTO_INSTALL}`"
        ) from None
    return AESGCM


__all__ = ["ENCRYPTED", "KEYS_VARIABLE", "MARK", "Encrypted", "Encryption", "is_sealed", "key_of"]
