"""Every Python block of the README runs as pasted, on SQLite.

The blocks are found when the tests are collected, so a section added to the
README is tested without touching this file. Conventions (documented in the
README's Development section):

* each block runs as a script of its own, in a fresh directory, with
  ``$CONVEYOR_URL`` unset (so ``sqlite:///conveyor.db`` is a file there);
* a block whose first line is a comment naming a file (``# myapp/tasks.py``) is
  also written to that path in the directories of the blocks after it, so later
  blocks can import it;
* the line ``<!-- readme-test: skip (reason) -->`` right before a block's fence
  skips it (for a block that needs PostgreSQL or a running server); use sparingly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\b(.*?)-->\s*$")
FILE_NAME = re.compile(r"^#\s*([\w./-]+\.py)\s*$")
TIMEOUT = 90  # seconds per block; the machine is shared


@dataclass(frozen=True)
class Block:
    """One fenced Python block of the README."""

    line: int  # where its fence opens (1-based)
    code: str
    skip: str | None  # the reason, when marked to be skipped

    @property
    def file(self) -> str | None:
        """The file the block says it is (its first line ``# path.py``), if any."""
        first = self.code.splitlines()[0] if self.code.strip() else ""
        match = FILE_NAME.match(first.strip())
        return match.group(1) if match else None


def readme_blocks(text: str) -> list[Block]:
    """The Python blocks of ``text``, in order."""
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = SKIP.search(before)
        reason = (marker.group(1).strip(" ()") or "marked") if marker else None
        blocks.append(Block(line=line, code=match.group(1), skip=reason))
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def test_the_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 5
    # The marker is for the few blocks that cannot run here; most must run.
    assert sum(b.skip is not None for b in BLOCKS) <= len(BLOCKS) // 4


def test_the_block_finder_handles_markers_and_files() -> None:
    text = (
        "x\n```python\n# pkg/mod.py\nA = 1\n```\n"
        "<!-- readme-test: skip (needs PostgreSQL) -->\n```python\nimport nothing\n```\n"
        "```bash\nnot python\n```\n"
    )
    first, second = readme_blocks(text)
    assert (first.line, first.file, first.skip) == (2, "pkg/mod.py", None)
    assert (second.file, second.skip) == (None, "needs PostgreSQL")


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"line{b.line}" for b in BLOCKS])
def test_readme_block_runs_as_pasted(index: int, tmp_path: Path) -> None:
    block = BLOCKS[index]
    if block.skip is not None:
        pytest.skip(f"README line {block.line}: {block.skip}")
    for earlier in BLOCKS[:index]:
        if earlier.file is not None:
            target = tmp_path / earlier.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(earlier.code, encoding="utf-8")
    script = tmp_path / f"readme_line_{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("CONVEYOR_URL", "CONVEYOR_APP")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, (
        f"README block at line {block.line} failed:\n{block.code}\n--- stderr ---\n{proc.stderr}"
    )
