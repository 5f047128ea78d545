"""Encryption at rest on both backends: a queue set ``encrypt=True`` stores every
value a user gives (payload, metadata, result, error, progress message) sealed,
opens it for a store with the keys, refuses a store without them before it
writes or leases anything, and never falls back to plaintext, across stores."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
from sqlalchemy import text

import conveyor
from conveyor.encryption import ENCRYPTED, MARK
from conveyor.store.base import TaskStore

K1 = base64.b64encode(b"1" * 32).decode()
K2 = base64.b64encode(b"2" * 32).decode()
OLD = conveyor.Encryption(keys={"2026-06": K1}, current="2026-06")
BOTH = conveyor.Encryption(keys={"2026-12": K2, "2026-06": K1}, current="2026-12")
NEW = conveyor.Encryption(keys={"2026-12": K2}, current="2026-12")

#: Values whose text must never appear in a raw table.
SECRETS = ("pay-s3cret", "meta-s3cret", "res-s3cret", "err-s3cret", "prog-s3cret")


async def _rows(store: TaskStore, sql: str, **params: Any) -> list[Any]:
    async def work(conn: Any) -> list[Any]:
        return list(await conn.execute(text(sql), params))

    return list(await store._run(work, write=False))


async def _raw_text(store: TaskStore) -> str:
    """Every stored value of the task and delivery tables, as one text."""
    tasks = await _rows(store, "SELECT payload, metadata FROM conveyor_tasks")
    deliveries = await _rows(
        store, "SELECT result, error, progress_message FROM conveyor_deliveries"
    )
    return "\n".join(str(value) for row in [*tasks, *deliveries] for value in row)


async def _count(store: TaskStore, table: str) -> int:
    return int((await _rows(store, f"SELECT count(*) AS n FROM {table}"))[0].n)


def _every_kind(queue: str, tag: str) -> list[dict[str, Any]]:
    """One request of each kind of submit (each kind takes its own statements)."""
    meta = {"who": f"meta-s3cret-{tag}"}
    base = {"name": "t", "queue": queue, "metadata": meta}
    return [
        {**base, "payload": {"s": f"pay-s3cret-{tag}-plain"}},
        {**base, "payload": {"s": f"pay-s3cret-{tag}-keyed"}, "key": f"k-{tag}"},
        {**base, "payload": {"s": f"pay-s3cret-{tag}-part"}, "partition": "p"},
        {
            **base,
            "payload": {"s": f"pay-s3cret-{tag}-rep"},
            "key": f"r-{tag}",
            "conflict": "replace",
        },
        {
            **base,
            "payload": {"s": f"pay-s3cret-{tag}-keypart"},
            "key": f"kp-{tag}",
            "partition": "p",
        },
    ]


async def _submit_every_kind(st: TaskStore, queue: str, tag: str) -> list[conveyor.Task]:
    made = [await st.submit(**req) for req in _every_kind(queue, tag)]
    made += await st.submit_many(
        [{"name": "t", "queue": queue, "payload": {"s": f"pay-s3cret-{tag}-{i}"}} for i in range(3)]
    )
    made += await st.submit_many(
        [
            {
                "name": "t",
                "queue": queue,
                "payload": {"s": f"pay-s3cret-{tag}-x{i}"},
                "key": f"x{i}-{tag}",
            }
            for i in range(2)
        ]
    )
    made.append(await st.submit("t", {"s": f"pay-s3cret-{tag}-child"}, queue=queue, parent=made[0]))
    return made


async def test_an_encrypted_queue_stores_no_plaintext_and_reads_back(store_url: str) -> None:
    async with conveyor.connect(store_url, encryption=BOTH) as st:
        await st.configure_queue("q", encrypt=True)
        assert (await st.get_queue("q"))["encrypt"] is True
        made = await _submit_every_kind(st, "q", "a")
        for task in made:
            assert str(task.payload["s"]).startswith("pay-s3cret-a")
            got = await st.get(task.id)
            assert got is not None and got.payload == task.payload
        claimed = await st.claim("q", worker_id="w", limit=100)
        assert {t.id for t in claimed} <= {t.id for t in made} and len(claimed) >= 2
        assert all(str(t.payload["s"]).startswith("pay-s3cret-a") for t in claimed)
        first, second, *rest = claimed
        await st.progress(first.id, worker_id="w", message="prog-s3cret", progress=0.5)
        done = await st.succeed(first.id, worker_id="w", result={"r": "res-s3cret"})
        assert done.result == {"r": "res-s3cret"} and done.progress_message == "prog-s3cret"
        failed = await st.fail(
            second.id, worker_id="w", error=ValueError("err-s3cret"), retryable=False
        )
        assert failed.error is not None and failed.error["message"] == "err-s3cret"
        outcomes = await st.ack_many(
            [{"task_id": t.id, "worker_id": "w", "result": "res-s3cret-many"} for t in rest]
        )
        assert outcomes == [None] * len(rest)
        for t in rest:
            got = await st.get(t.id)
            assert got is not None and got.result == "res-s3cret-many"
        page = await st.list(queue="q", limit=100)
        assert {t.id for t in page.items} == {t.id for t in made}
        raw = await _raw_text(st)
        assert not any(secret in raw for secret in SECRETS), raw
        keyed = await _rows(st, "SELECT key_id FROM conveyor_tasks")
        assert {row.key_id for row in keyed} == {"2026-12"}
        stored = await _rows(st, "SELECT payload FROM conveyor_tasks")
        assert all(row.payload.startswith(MARK + "2026-12:") for row in stored)


async def test_a_store_without_keys_writes_nothing_to_an_encrypted_queue(store_url: str) -> None:
    """Store B opened (and submitted to the queue) before store A set it encrypted:
    every kind of B's submit is refused, nothing written, no key left claimed."""
    async with (
        conveyor.connect(store_url, encryption=BOTH) as a,
        conveyor.connect(store_url) as b,
    ):
        await b.submit("t", {"s": "plain before"}, queue="q")  # B believes q plain
        await a.configure_queue("q", encrypt=True)
        tasks, deliveries = (
            await _count(b, "conveyor_tasks"),
            await _count(b, "conveyor_deliveries"),
        )
        # Each kind by a store of its own, which has never seen q encrypted: its
        # plain statement is what refuses.
        for req in _every_kind("q", "b"):
            async with conveyor.connect(store_url) as fresh:
                with pytest.raises(conveyor.ConfigurationError, match="encryption key is needed"):
                    await fresh.submit(**req)
        for batch in (
            [{"name": "t", "queue": "q"}, {"name": "t", "queue": "other"}],
            [{"name": "t", "queue": "other"}] * 300 + [{"name": "t", "queue": "q"}],
            [{"name": "t", "queue": "q", "key": f"m{i}"} for i in range(2)],
        ):
            async with conveyor.connect(store_url) as fresh:
                with pytest.raises(conveyor.ConfigurationError, match="'q' is encrypted"):
                    await fresh.submit_many(batch)
        assert await _count(b, "conveyor_tasks") == tasks
        assert await _count(b, "conveyor_deliveries") == deliveries
        assert await _count(b, "conveyor_keys") == 0
        assert await b.get_by_key("k-b") is None


async def test_a_store_with_keys_that_believed_a_queue_plain_seals(store_url: str) -> None:
    """Store B (with keys) submitted to q while it was plain; A then set it
    encrypted: B's next submits of every kind are sealed, not plaintext."""
    async with (
        conveyor.connect(store_url, encryption=BOTH) as a,
        conveyor.connect(store_url, encryption=BOTH) as b,
    ):
        before = await b.submit("t", {"s": "plain before"}, queue="q")
        await b.submit("t", queue="q", partition="p")
        await a.configure_queue("q", encrypt=True)
        made = []
        for req in _every_kind("q", "c"):
            # Each kind by a store of its own that believes q plain.
            async with conveyor.connect(store_url, encryption=BOTH) as fresh:
                made.append(await fresh.submit(**req))
        async with conveyor.connect(store_url, encryption=BOTH) as fresh:
            made += await fresh.submit_many(
                [
                    {"name": "t", "queue": "q", "payload": {"s": f"pay-s3cret-m{i}"}}
                    for i in range(400)
                ]
            )
        made += await _submit_every_kind(b, "q", "d")
        rows = await _rows(
            b,
            "SELECT id, payload, metadata, key_id FROM conveyor_tasks WHERE id <> :id",
            id=before.id,
        )
        sealed = [r for r in rows if r.key_id is not None]
        assert {r.id for r in sealed} == {t.id for t in made}
        assert all(r.payload.startswith(MARK) for r in sealed)
        # Metadata is sealed unless empty (nothing to hide).
        assert all(r.metadata == "{}" or r.metadata.startswith(MARK) for r in sealed)
        assert any(r.metadata.startswith(MARK) for r in sealed)
        raw = await _raw_text(b)
        assert "pay-s3cret" not in raw and "meta-s3cret" not in raw
        # The partitioned tasks are in their stream in order, the first one first.
        claimed = await b.claim("q", worker_id="w", partition="p", limit=10)
        assert claimed and claimed[0].partition == "p"


async def test_submit_in_the_callers_transaction_is_sealed_or_refused(store_url: str) -> None:
    async with (
        conveyor.connect(store_url, encryption=BOTH) as a,
        conveyor.connect(store_url, encryption=BOTH) as b,
    ):
        await b.submit("t", queue="q")
        await a.configure_queue("q", encrypt=True)
        assert b._engine is not None
        async with b._engine.begin() as conn:
            task = await b.submit("t", {"s": "pay-s3cret-tx"}, queue="q", connection=conn)
        stored = await _rows(b, "SELECT payload FROM conveyor_tasks WHERE id = :id", id=task.id)
        assert stored[0].payload.startswith(MARK)
        got = await a.get(task.id)
        assert got is not None and got.payload == {"s": "pay-s3cret-tx"}


async def test_a_claim_without_keys_is_refused_before_any_lease(store_url: str) -> None:
    async with (
        conveyor.connect(store_url, encryption=BOTH) as a,
        conveyor.connect(store_url) as b,
    ):
        await a.configure_queue("q", encrypt=True)
        task = await a.submit("t", {"s": "x"}, queue="q")
        plain = await a.submit("t", {"s": "y"}, queue="plain")
        for queues in (["q"], ["plain", "q"]):
            with pytest.raises(conveyor.ConfigurationError, match="encryption key is needed"):
                await b.claim(queues, worker_id="wb")
        got = await a.get(task.id)
        assert got is not None and got.status is conveyor.Status.QUEUED and got.attempt == 0
        other = await a.get(plain.id)
        assert other is not None and other.status is conveyor.Status.QUEUED
        # A plain queue alone claims as ever.
        assert [t.id for t in await b.claim("plain", worker_id="wb")] == [plain.id]


async def test_a_row_that_does_not_open_raises_decryption_error(store_url: str) -> None:
    async with (
        conveyor.connect(store_url, encryption=OLD) as a,
        conveyor.connect(store_url, encryption=NEW) as b,
        conveyor.connect(store_url) as keyless,
    ):
        await a.configure_queue("q", encrypt=True)
        one = await a.submit("t", {"s": "one"}, queue="q")
        two = await a.submit("t", {"s": "two"}, queue="q")
        with pytest.raises(conveyor.DecryptionError) as caught:
            await b.get(one.id)
        assert caught.value.task_id == one.id and caught.value.key_id == "2026-06"
        assert one.id in str(caught.value) and "2026-06" in str(caught.value)
        with pytest.raises(conveyor.DecryptionError):
            await keyless.get(one.id)

        # A ciphertext moved to another row does not open there.
        async def move(conn: Any) -> None:
            await conn.execute(
                text(
                    "UPDATE conveyor_tasks SET payload = "
                    "(SELECT payload FROM conveyor_tasks WHERE id = :src) WHERE id = :dst"
                ),
                {"src": one.id, "dst": two.id},
            )

        await a._run(move)
        with pytest.raises(conveyor.DecryptionError) as moved:
            await a.get(two.id)
        assert moved.value.task_id == two.id
        # The dashboard's reads show what they cannot open as "encrypted".
        keyless.internal.show_sealed()
        shown = await keyless.get(one.id)
        assert (
            shown is not None and shown.payload is ENCRYPTED and str(shown.payload) == "encrypted"
        )


async def test_old_keys_keep_opening_and_rekey_moves_rows_to_the_current_key(
    store_url: str,
) -> None:
    async with conveyor.connect(store_url, encryption=OLD) as old:
        await old.submit("t", {"s": "pay-s3cret-before"}, queue="q")  # plain
        await old.configure_queue("q", encrypt=True)
        made = [await old.submit("t", {"s": f"pay-s3cret-{i}"}, queue="q") for i in range(4)]
        [held] = await old.claim("q", worker_id="w")
        await old.succeed(held.id, worker_id="w", result="res-s3cret")
        await old.submit("t", {"s": "other queue"}, queue="plain")
    async with conveyor.connect(store_url, encryption=BOTH) as st:
        for task in made:
            got = await st.get(task.id)
            assert got is not None and got.payload == task.payload
        assert await st.internal.count_rekey() == 5  # four sealed under 2026-06, one plain
        assert await st.internal.count_rekey("plain") == 0
        batches: list[int] = []
        # Cut short after the first batch: what it committed stays.
        with pytest.raises(RuntimeError):

            def stop(n: int) -> None:
                batches.append(n)
                raise RuntimeError("stop")

            await st.rekey("q", batch=2, on_batch=stop)
        assert batches == [2]
        assert await st.internal.count_rekey() == 3
        assert await st.rekey(batch=2, on_batch=batches.append) == 3
        assert batches == [2, 2, 1]
        assert await st.rekey() == 0
        rows = await _rows(st, "SELECT queue, key_id FROM conveyor_tasks")
        assert (
            sorted((r.queue, r.key_id) for r in rows) == [("plain", None)] + [("q", "2026-12")] * 5
        )
        raw = await _raw_text(st)
        assert "pay-s3cret" not in raw and "res-s3cret" not in raw
    # Only the new key now: everything of q opens.
    async with conveyor.connect(store_url, encryption=NEW) as new:
        page = await new.list(queue="q", limit=10)
        assert len(page.items) == 5
        done = await new.get(held.id)
        assert done is not None and done.result == "res-s3cret"


async def test_no_keys_means_no_rekey(store: TaskStore) -> None:
    with pytest.raises(conveyor.ConfigurationError, match="rekey needs the encryption keys"):
        await store.rekey()
    with pytest.raises(conveyor.InvalidArgument, match="batch"):
        await store.rekey(batch=0)


async def test_a_queue_set_no_encrypt_takes_plain_submits_again(store_url: str) -> None:
    async with conveyor.connect(store_url, encryption=BOTH) as a, conveyor.connect(store_url) as b:
        await a.configure_queue("q", encrypt=True)
        sealed = await a.submit("t", {"s": "sealed"}, queue="q")
        await a.configure_queue("q", encrypt=False)
        plain = await b.submit("t", {"s": "plain"}, queue="q")
        rows = await _rows(a, "SELECT id, key_id FROM conveyor_tasks ORDER BY seq")
        assert [(r.id, r.key_id) for r in rows] == [(sealed.id, "2026-12"), (plain.id, None)]
        # The sealed one still opens for a store with the key; its new plain
        # submits go plain.
        got = await a.get(sealed.id)
        assert got is not None and got.payload == {"s": "sealed"}
        third = await a.submit("t", {"s": "third"}, queue="q")
        assert (await _rows(a, "SELECT key_id FROM conveyor_tasks WHERE id = :id", id=third.id))[
            0
        ].key_id is None


def test_encryption_checks_its_keys() -> None:
    with pytest.raises(conveyor.InvalidArgument, match="2026-12"):
        conveyor.Encryption(keys={"2026-12": b"short"}, current="2026-12")
    with pytest.raises(conveyor.InvalidArgument, match="current"):
        conveyor.Encryption(keys={"a": K1}, current="b")
    with pytest.raises(conveyor.InvalidArgument, match="key id"):
        conveyor.Encryption(keys={"a:b": K1}, current="a:b")
    same = conveyor.Encryption(keys={"2026-06": b"1" * 32, "2026-12": b"2" * 32}, current="2026-12")
    assert same == BOTH and hash(same) == hash(BOTH)  # bytes or their base64: the same keys
    with pytest.raises(TypeError):
        BOTH.keys["x"] = b"x" * 32  # type: ignore[index]
    raw = conveyor.Encryption(keys={"a": os.urandom(32)}, current="a")
    assert raw.key_ids() == ("a",) and "keys=['a']" in repr(raw) and K1 not in repr(BOTH)
    parsed = conveyor.Encryption.from_env(f"new={K2}, old={K1}")
    assert parsed is not None and parsed.current == "new" and parsed.key_ids() == ("new", "old")
    assert conveyor.Encryption.from_env("") is None
    with pytest.raises(conveyor.ConfigurationError, match=r"CONVEYOR_ENCRYPTION_KEYS.*'bad'"):
        conveyor.Encryption.from_env("bad=bm90IGEga2V5")
    with pytest.raises(conveyor.ConfigurationError, match="entry 2"):
        conveyor.Encryption.from_env(f"a={K1},nokey")
    with pytest.raises(conveyor.InvalidArgument, match="encrypt"):
        conveyor.connect("sqlite:///x.db", encryption="yes")  # type: ignore[arg-type]


def test_connect_reads_the_keys_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("CONVEYOR_ENCRYPTION_KEYS", f"2026-12={K2},2026-06={K1}")
    st = conveyor.connect(f"sqlite:///{tmp_path / 'e.db'}")
    assert st.encryption == BOTH


async def test_a_dead_letter_of_a_sealed_task_is_sealed_too(store_url: str) -> None:
    """The letter in a plain dead-letter queue holds the original's payload and
    error sealed (under its own id), and reads back whole."""
    async with conveyor.connect(store_url, encryption=BOTH) as st:
        await st.configure_queue("q", encrypt=True, dead_letter="dlq")
        task = await st.submit("t", {"s": "pay-s3cret"}, queue="q", max_attempts=1)
        [held] = await st.claim("q", worker_id="w")
        await st.fail(held.id, worker_id="w", error=ValueError("err-s3cret"), retryable=False)
        [letter] = (await st.list(queue="dlq")).items
        assert letter.parent_id == task.id and letter.payload == {"s": "pay-s3cret"}
        assert letter.metadata["dead_letter"]["error"]["message"] == "err-s3cret"
        rows = await _rows(st, "SELECT key_id FROM conveyor_tasks WHERE id = :id", id=letter.id)
        assert rows[0].key_id == "2026-12"
        raw = await _raw_text(st)
        assert "pay-s3cret" not in raw and "err-s3cret" not in raw


async def test_a_store_learns_that_a_queue_is_no_longer_encrypted(store_url: str) -> None:
    """B knows q encrypted; A turns encryption off. B's next submit is still sealed
    (never less safe than asked), and tells B, whose submits after it go plain."""
    async with (
        conveyor.connect(store_url, encryption=BOTH) as a,
        conveyor.connect(store_url, encryption=BOTH) as b,
    ):
        await a.configure_queue("q", encrypt=True)
        await b.submit("t", queue="q")  # B learns q is encrypted (and seals)
        await a.configure_queue("q", encrypt=False)
        first = await b.submit("t", {"n": 1}, queue="q")
        second = await b.submit_many([{"name": "t", "payload": {"n": 2}, "queue": "q"}] * 2)
        rows = await _rows(b, "SELECT id, key_id FROM conveyor_tasks ORDER BY seq")
        keys = {r.id: r.key_id for r in rows}
        assert keys[first.id] == "2026-12"
        assert [keys[t.id] for t in second] == [None, None]
        got = await b.get(first.id)
        assert got is not None and got.payload == {"n": 1}


async def test_a_large_batch_to_an_encrypted_queue_is_sealed_in_runs(store_url: str) -> None:
    """A batch of 600 (sent in runs) by a store that knows the queue encrypted, and
    by one that does not: every task sealed, all in request order."""
    async with conveyor.connect(store_url, encryption=BOTH) as st:
        await st.configure_queue("big", encrypt=True)
        reqs = [
            {"name": "t", "payload": {"n": f"pay-s3cret-{i}"}, "queue": "big"} for i in range(600)
        ]
        made = await st.submit_many(reqs)
        async with conveyor.connect(store_url, encryption=BOTH) as other:
            made += await other.submit_many(reqs)
        assert [t.payload for t in made] == [r["payload"] for r in reqs] * 2
        rows = await _rows(st, "SELECT key_id, count(*) AS n FROM conveyor_tasks GROUP BY key_id")
        assert [(r.key_id, r.n) for r in rows] == [("2026-12", 1200)]
        assert "pay-s3cret" not in await _raw_text(st)
        claimed = await st.claim("big", worker_id="w", limit=10)
        assert [t.payload["n"] for t in claimed] == [f"pay-s3cret-{i}" for i in range(10)]


async def test_a_progress_message_that_would_read_as_sealed_is_refused(store: TaskStore) -> None:
    await store.submit("t", queue="q")
    [held] = await store.claim("q", worker_id="w")
    with pytest.raises(conveyor.InvalidArgument, match="message"):
        await store.progress(held.id, worker_id="w", message=MARK + "k:abc")
    task = await store.progress(held.id, worker_id="w", message="~ fine")
    assert task.progress_message == "~ fine"


def test_a_sealed_request_keeps_every_other_field() -> None:
    """seal_request copies the request field by field: none may be left behind."""
    import dataclasses

    from conveyor.store.protocol import producer, sealing
    from conveyor.store.protocol.requests import prepare

    class Holder:
        _keyring = sealing.Keyring(BOTH)

    req = prepare(
        {
            "name": "n",
            "payload": {"a": 1},
            "queue": "q",
            "priority": 3,
            "delay": 5,
            "max_attempts": 4,
            "backoff": 2,
            "key": "k",
            "conflict": "replace",
            "partition": "p",
            "parent": "x",
            "correlation_id": "c",
            "metadata": {"m": 1},
        }
    )
    out = producer.seal_request(Holder(), req)  # type: ignore[arg-type]
    changed = {
        f.name for f in dataclasses.fields(req) if getattr(req, f.name) != getattr(out, f.name)
    }
    assert changed == {"payload", "metadata", "key_id"}
    assert BOTH.open(out.payload, task_id=req.id, field="payload") == req.payload


async def test_a_store_that_did_not_claim_the_task_seals_what_it_writes(store_url: str) -> None:
    """The holder's writes go through another store (an outcome recorded
    elsewhere): it looks the task up and seals, or without keys writes nothing."""
    async with (
        conveyor.connect(store_url, encryption=BOTH) as one,
        conveyor.connect(store_url, encryption=BOTH) as other,
        conveyor.connect(store_url) as keyless,
    ):
        await one.configure_queue("q", encrypt=True)
        made = await one.submit_many(
            [{"name": "t", "queue": "q", "payload": {"s": f"pay-s3cret-{i}"}} for i in range(4)]
        )
        held = await one.claim("q", worker_id="w", limit=4)
        assert {t.id for t in held} == {t.id for t in made}
        first, second, third, fourth = held
        await other.progress(first.id, worker_id="w", message="prog-s3cret")
        await other.succeed(first.id, worker_id="w", result={"r": "res-s3cret"})
        await other.fail(second.id, worker_id="w", error="err-s3cret", retryable=False)
        assert await other.ack_many(
            [{"task_id": third.id, "worker_id": "w", "result": "res-s3cret-many"}]
        ) == [None]
        with pytest.raises(conveyor.ConfigurationError, match="encryption key"):
            await keyless.succeed(fourth.id, worker_id="w", result="res-s3cret-keyless")
        with pytest.raises(conveyor.ConfigurationError, match="encryption key"):
            await keyless.ack_many([{"task_id": fourth.id, "worker_id": "w", "result": 1}])
        with pytest.raises(conveyor.ConfigurationError, match="encryption key"):
            await keyless.progress(fourth.id, worker_id="w", message="prog-s3cret-keyless")
        still = await one.get(fourth.id)
        assert still is not None and still.status is conveyor.Status.RUNNING
        assert still.result is None and still.progress_message is None
        raw = await _raw_text(one)
        assert not any(secret in raw for secret in SECRETS), raw
        got = await one.get(first.id)
        assert got is not None and got.result == {"r": "res-s3cret"}
        assert got.progress_message == "prog-s3cret"
        failed = await one.get(second.id)
        assert failed is not None and failed.error is not None
        assert failed.error["message"] == "err-s3cret"


async def test_a_store_holding_more_than_it_remembers_still_seals(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.store.protocol import sealing

    monkeypatch.setattr(sealing, "HELD", 2)  # the oldest held tasks are forgotten
    async with conveyor.connect(store_url, encryption=BOTH) as st:
        await st.configure_queue("q", encrypt=True)
        await st.submit_many([{"name": "t", "queue": "q", "payload": i} for i in range(5)])
        held = await st.claim("q", worker_id="w", limit=5)
        assert len(held) == 5 and len(st._keyring.held) == 2
        outcomes = await st.ack_many(
            [{"task_id": t.id, "worker_id": "w", "result": "res-s3cret"} for t in held]
        )
        assert outcomes == [None] * 5
        raw = await _raw_text(st)
        assert "res-s3cret" not in raw
        for t in held:
            got = await st.get(t.id)
            assert got is not None and got.result == "res-s3cret"
