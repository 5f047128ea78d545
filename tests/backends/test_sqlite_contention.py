"""SQLite: busy/locked never reaches the user under ordinary multi-process use."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import conveyor

HAMMER = textwrap.dedent(
    """
    import asyncio, json, sys
    import conveyor

    async def main(url: str, me: int, n: int) -> None:
        done = 0
        async with conveyor.connect(url) as st:
            for i in range(n):
                await st.submit("t", {"p": me, "i": i}, queue="hammer")
                for task in await st.claim("hammer", worker_id=f"w{me}", limit=2):
                    await st.succeed(task.id, worker_id=f"w{me}")
                    done += 1
                if i % 10 == 0:
                    await st.maintain()
            while True:
                batch = await st.claim("hammer", worker_id=f"w{me}", limit=10)
                if not batch:
                    break
                for task in batch:
                    await st.succeed(task.id, worker_id=f"w{me}")
                    done += 1
        print(json.dumps({"done": done}))

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    """
)


def test_four_processes_hammering_one_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hammer.db'}"
    script = tmp_path / "hammer.py"
    script.write_text(HAMMER)
    n = 150
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, str(me), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert "locked" not in err and "busy" not in err
    done = sum(json.loads(out.strip().splitlines()[-1])["done"] for out, _ in outputs)
    with conveyor.connect_sync(url) as st:
        [stats] = st.stats("hammer")
    assert stats.counts["succeeded"] == 4 * n
    assert done == 4 * n
