"""Sealing: the protocol's side of encryption at rest (:mod:`conveyor.encryption`).

Values are sealed and opened here, in Python, never in SQL. What is sealed: the
payload and metadata of a task of an encrypted queue (at submit, by the
step-by-step submit, :func:`conveyor.store.protocol.producer.insert_tasks`), and
the result, error and progress message its lease holder writes.

Fail closed, across processes: whether a queue is encrypted is the database's
``conveyor_queues.encrypt``, not what a store remembers. Every submit statement
that writes plain rows (all but ``insert_rows``) writes nothing when a queue of
its rows is encrypted, so a store that still believes a queue plain cannot
write plaintext to it: its rows come back missing, the protocol raises
:class:`Refused`, and the submit goes again step by step, which reads the
settings in its own transaction and seals (or raises ``ConfigurationError``
when this store has no key). ``insert_rows`` refuses a plain row of an
encrypted queue the same way (writing nothing, and a row saying so), and the
settings are read again in the same transaction. A claim by a store without
keys is refused by the claim itself before it leases anything.

What a store remembers (:class:`Keyring`): the queues it has seen encrypted,
so their submits go step by step at once instead of being refused first, and
the tasks it claimed, each with whether its values are sealed. A write for a
task it did not claim (another store's lease, or one forgotten past
:data:`HELD`) reads the task's key id first (:func:`sealed_tasks`): whichever
store writes a sealed task's result, error or progress message seals it, or,
without keys, refuses.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from conveyor.encryption import ENCRYPTED, MARK, Encrypted, Encryption, is_sealed, key_of
from conveyor.errors import ConfigurationError, DecryptionError
from conveyor.schema import tasks as t
from conveyor.store.protocol import transactions as tx

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: How many held tasks a store remembers as sealed (the oldest forgotten first:
#: a lease lost without an outcome leaves its entry behind).
HELD = 100_000


class Refused(Exception):
    """A submit statement wrote nothing: a queue of its rows is encrypted (the
    statement's own check). The submit goes again step by step."""


class Keyring:
    """A store's keys (``None``: none) and what it remembers about sealing."""

    def __init__(self, encryption: Encryption | None) -> None:
        #: The keys, or None: this store opens nothing and refuses encrypted queues.
        self.encryption = encryption
        #: Show values this store cannot open as :data:`~conveyor.encryption.ENCRYPTED`
        #: instead of raising (the dashboard's reads).
        self.show_sealed = False
        #: Queues this store has seen encrypted: their submits go step by step.
        self.encrypted: set[str] = set()
        #: Tasks this store claimed, each with whether it is sealed (its payload
        #: was, or its queue is encrypted): what their holder writes is sealed.
        #: A task not here (another store claimed it, or it was forgotten) is
        #: looked up before a write (:func:`sealed_tasks`).
        self.held: OrderedDict[str, bool] = OrderedDict()

    # ------------------------------------------------------------- writing
    def seal(self, text: str, task_id: str, field: str) -> str:
        """``text`` sealed for ``task_id``'s ``field`` (the current key)."""
        assert self.encryption is not None
        return self.encryption.seal(text, task_id=task_id, field=field)

    def require(self, queue: str) -> Encryption:
        """The keys, or ConfigurationError: ``queue`` is encrypted and this store has none."""
        if self.encryption is None:
            raise ConfigurationError(
                f"queue {queue!r} is encrypted: an encryption key is needed (pass "
                "encryption=conveyor.Encryption(...) to connect(), or set "
                "$CONVEYOR_ENCRYPTION_KEYS)"
            )
        return self.encryption

    def seal_for(self, text: str, task_id: str, field: str) -> str:
        """``text`` sealed for a sealed task's ``field``; ConfigurationError, nothing
        written, when this store has no keys."""
        if self.encryption is None:
            raise ConfigurationError(
                f"task {task_id} is encrypted: an encryption key is needed to write its "
                f"{field} (pass encryption=conveyor.Encryption(...) to connect(), or set "
                "$CONVEYOR_ENCRYPTION_KEYS); nothing was written"
            )
        return self.seal(text, task_id, field)

    def hold(self, task_id: str, sealed: bool) -> None:
        """Remember that this store claimed ``task_id``, and whether what its
        holder writes is sealed."""
        held = self.held
        held[task_id] = sealed
        if len(held) > HELD:
            held.popitem(last=False)

    def release(self, task_ids: Iterable[str]) -> None:
        """Forget ``task_ids`` (their outcome is written)."""
        held = self.held
        if held:
            for task_id in task_ids:
                held.pop(task_id, None)

    def learn(self, queues: Iterable[str], encrypted: Iterable[str]) -> None:
        """What a statement read: of ``queues``, those in ``encrypted`` are."""
        found = set(encrypted)
        self.encrypted |= found
        self.encrypted -= set(queues) - found

    # ------------------------------------------------------------- reading
    def open(self, text: str, task_id: str, field: str) -> str | Encrypted:
        """The plain text of a sealed value; :data:`ENCRYPTED` when this store
        cannot open it and shows sealed values; else DecryptionError."""
        enc = self.encryption
        if enc is None or key_of(text) not in enc.keys:
            if self.show_sealed:
                return ENCRYPTED
            if enc is None:
                raise DecryptionError(task_id, key_of(text), "this store has no encryption keys")
        assert enc is not None
        return enc.open(text, task_id=task_id, field=field)

    def load(self, text: str, task_id: str, field: str) -> Any:
        """A stored JSON value, sealed or not, as its value."""
        if not is_sealed(text):
            return json.loads(text)
        plain = self.open(text, task_id, field)
        return plain if isinstance(plain, Encrypted) else json.loads(plain)


async def sealed_tasks(st: Any, task_ids: Iterable[str]) -> set[str]:
    """Of ``task_ids``, those whose values are sealed (their task has a key id),
    for the ones this store did not claim itself: one read, only for those."""
    keyring: Keyring = st._keyring
    unknown = sorted({task_id for task_id in task_ids if task_id not in keyring.held})
    found = {task_id for task_id in task_ids if keyring.held.get(task_id)}
    if unknown:

        async def look(conn: AsyncConnection) -> set[str]:
            stmt = select(t.c.id).where(t.c.id.in_(unknown), t.c.key_id.is_not(None))
            return {row.id for row in await conn.execute(stmt)}

        found |= await tx.run(st, look, write=False)
    return found


async def sealed_write(
    st: Any, task_id: str, field: str, text: str | None, *, forget: bool = False
) -> str | None:
    """``text`` as a write of ``task_id``'s ``field`` stores it: sealed if the task
    is sealed, whichever store claimed it (ConfigurationError when this store has
    no keys), else as it is. ``forget``: its outcome is being written."""
    keyring: Keyring = st._keyring
    if text is None:
        return text
    held = keyring.held.pop(task_id, None) if forget else keyring.held.get(task_id)
    if held is None:
        held = task_id in await sealed_tasks(st, [task_id])
    return keyring.seal_for(text, task_id, field) if held else text


def claimed_from(st: Any, queues: Iterable[str], sealed: Iterable[str]) -> None:
    """What a claim of ``queues`` read before leasing: ``sealed``, the encrypted
    ones. Remembered (their tasks' values are sealed when written); with no keys,
    ConfigurationError (the claim hook leased nothing)."""
    found = sorted(set(sealed))
    keyring: Keyring = st._keyring
    keyring.learn(queues, found)
    if found:
        keyring.require(found[0])


#: What a store without keys reads with (nothing opens).
NO_KEYS = Keyring(None)


def load(keyring: Keyring | None, text: str, task_id: str, field: str) -> Any:
    """A stored JSON value, sealed or not (``keyring`` None: no keys)."""
    return (keyring or NO_KEYS).load(text, task_id, field)


def open_text(keyring: Keyring | None, text: str | None, task_id: str, field: str) -> Any:
    """A stored text value (a progress message), sealed or not."""
    if text is None or not text.startswith(MARK):
        return text
    return (keyring or NO_KEYS).open(text, task_id, field)


__all__ = ["HELD", "NO_KEYS", "Keyring", "Refused", "load", "open_text"]
