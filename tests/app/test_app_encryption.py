"""An App's worker on an encrypted queue, on both backends: handlers see the
payload and progress opened, results and errors are stored sealed, and a
worker whose store has no keys refuses to start claiming the queue."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from sqlalchemy import text

import conveyor
from conveyor.encryption import MARK
from conveyor.testing import run_tasks
from conveyor.worker import Context

KEYS = conveyor.Encryption(keys={"w": base64.b64encode(b"w" * 32).decode()}, current="w")


async def test_a_worker_runs_an_encrypted_queue(store_url: str) -> None:
    app = conveyor.App(store_url, encryption=KEYS)
    seen: list[Any] = []

    @app.task(queue="vault", max_attempts=1)
    async def charge(ctx: Context, card: str) -> dict[str, str]:
        seen.append((card, ctx.task.metadata))
        await ctx.progress(0.5, f"charging {card}")
        if card == "bad-s3cret":
            raise ValueError("declined bad-s3cret")
        return {"receipt": f"rcpt-{card}"}

    async with app:
        await app.store.configure_queue("vault", encrypt=True)
        ok = await charge.with_options(metadata={"who": "meta-s3cret"}).submit("good-s3cret")
        await charge.submit("bad-s3cret")
        drained = await run_tasks(app)
        assert [t.id for t in drained.succeeded] == [ok.id]
        assert drained.succeeded[0].result == {"receipt": "rcpt-good-s3cret"}
        assert drained.failed[0].error is not None
        assert "declined bad-s3cret" in drained.failed[0].error["message"]
        assert seen[0] == ("good-s3cret", {"who": "meta-s3cret"})

        async def raw(conn: Any) -> list[Any]:
            found = await conn.execute(
                text(
                    "SELECT t.payload, t.metadata, d.result, d.error, d.progress_message "
                    "FROM conveyor_tasks AS t JOIN conveyor_deliveries AS d ON d.task_seq = t.seq"
                )
            )
            return list(found)

        rows = await app.store._run(raw, write=False)
        values = [value for row in rows for value in row if value not in (None, "{}")]
        assert values and all(value.startswith(MARK) for value in values), [
            v for v in values if not v.startswith(MARK)
        ]
        assert not any("s3cret" in value for value in values)


async def test_a_worker_without_keys_refuses_an_encrypted_queue(store_url: str) -> None:
    async with conveyor.connect(store_url, encryption=KEYS) as keyed:
        await keyed.configure_queue("vault", encrypt=True)
        task = await keyed.submit("charge", {"card": "x"}, queue="vault")
    app = conveyor.App(store_url)

    @app.task(queue="vault")
    async def charge(ctx: Context, card: str) -> None:  # pragma: no cover - never runs
        raise AssertionError("ran without the key")

    async with app:
        with pytest.raises(conveyor.ConfigurationError, match="encryption key is needed"):
            await run_tasks(app)
    async with conveyor.connect(store_url, encryption=KEYS) as keyed:
        got = await keyed.get(task.id)
        assert got is not None and got.status is conveyor.Status.QUEUED and got.attempt == 0
