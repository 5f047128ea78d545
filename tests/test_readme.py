"""Every Python block of the README and of every ``docs/**/*.md`` page runs as
pasted, on SQLite; every relative link of those pages leads somewhere.

The blocks are found when the tests are collected, so a section or a page added
to docs/ is tested without touching this file. Conventions (documented in
CONTRIBUTING.md, under "Tests"):

* each block runs as a script of its own, in a fresh directory, with
  ``$CONVEYOR_URL`` unset (so ``sqlite:///conveyor.db`` is a file there);
* a block whose first line is a comment naming a file (``# myapp/tasks.py``) is
  also written to that path in the directories of the blocks after it on its
  page; the README's files are also written for every block of docs/, which
  builds on the README's quickstart (a later file of one path wins);
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
from urllib.parse import unquote

import pytest

from _docs import README, ROOT, name, pages, without_code

FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\b(.*?)-->\s*$")
FILE_NAME = re.compile(r"^#\s*([\w./-]+\.py)\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
TIMEOUT = 90  # seconds per block; the machine is shared


@dataclass(frozen=True)
class Block:
    """One fenced Python block of a page."""

    page: str  # the page's path from the repository's root
    line: int  # where its fence opens (1-based)
    code: str
    skip: str | None  # the reason, when marked to be skipped

    @property
    def file(self) -> str | None:
        """The file the block says it is (its first line ``# path.py``), if any."""
        first = self.code.splitlines()[0] if self.code.strip() else ""
        match = FILE_NAME.match(first.strip())
        return match.group(1) if match else None


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    """The Python blocks of ``text`` (the page ``page``), in order."""
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = SKIP.search(before)
        reason = (marker.group(1).strip(" ()") or "marked") if marker else None
        blocks.append(Block(page=page, line=line, code=match.group(1), skip=reason))
    return blocks


PAGES = pages()
BLOCKS = [b for page in PAGES for b in readme_blocks(page.read_text("utf-8"), name(page))]
README_BLOCKS = [b for b in BLOCKS if b.page == name(README)]


def files_before(index: int) -> list[Block]:
    """The blocks naming files that the block ``index`` sees: the earlier ones of
    its page, after (for a page of docs/) every one of the README."""
    block = BLOCKS[index]
    own = [b for b in BLOCKS[:index] if b.page == block.page]
    shared = [] if block.page == name(README) else README_BLOCKS
    return [b for b in (*shared, *own) if b.file is not None]


def test_the_readme_has_python_blocks() -> None:
    assert len(README_BLOCKS) >= 3
    assert len(BLOCKS) >= 10
    assert any(b.page.startswith("docs/") for b in BLOCKS), "no Python block found in docs/"
    # The marker is for the few blocks that cannot run here; most must run.
    assert sum(b.skip is not None for b in BLOCKS) <= len(BLOCKS) // 4


def test_the_block_finder_handles_markers_and_files() -> None:
    text = (
        "x\n```python\n# pkg/mod.py\nA = 1\n```\n"
        "<!-- readme-test: skip (needs PostgreSQL) -->\n```python\nimport nothing\n```\n"
        "```bash\nnot python\n```\n"
    )
    first, second = readme_blocks(text, "docs/x.md")
    assert (first.page, first.line, first.file, first.skip) == ("docs/x.md", 2, "pkg/mod.py", None)
    assert (second.file, second.skip) == (None, "needs PostgreSQL")


def test_a_docs_block_sees_the_readme_files_and_its_own_pages_only() -> None:
    readme_files = [b for b in README_BLOCKS if b.file is not None]
    for index, block in enumerate(BLOCKS):
        seen = files_before(index)
        assert all(b.page in (block.page, name(README)) for b in seen)
        if block.page != name(README):
            assert [b for b in seen if b.page == name(README)] == readme_files


@pytest.mark.parametrize(
    "index", range(len(BLOCKS)), ids=[f"{b.page}:line{b.line}" for b in BLOCKS]
)
def test_readme_block_runs_as_pasted(index: int, tmp_path: Path) -> None:
    block = BLOCKS[index]
    if block.skip is not None:
        pytest.skip(f"{block.page} line {block.line}: {block.skip}")
    for earlier in files_before(index):
        assert earlier.file is not None
        target = tmp_path / earlier.file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(earlier.code, encoding="utf-8")
    script = tmp_path / f"block_line_{block.line}.py"
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
        f"{block.page} block at line {block.line} failed:\n{block.code}\n"
        f"--- stderr ---\n{proc.stderr}"
    )


def test_the_quickstart_runs_beside_leftover_tasks(tmp_path: Path) -> None:
    """Run where ./conveyor.db holds what other examples, or an earlier run cut
    short, left on the quickstart's queue: it still claims its own task. Twice."""
    import conveyor
    from _docs import blocks

    quickstart = blocks("Quickstart")[0]
    with conveyor.connect_sync(f"sqlite:///{tmp_path / 'conveyor.db'}") as store:
        store.submit("send_email", {"to": "left@over"}, queue="emails")
        store.submit("report", {"day": "2026-11-29"})
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("CONVEYOR_URL", "CONVEYOR_APP")}
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert proc.returncode == 0, proc.stderr
        assert "succeeded {'sent': True}" in proc.stdout


def anchor(heading: str) -> str:
    """The fragment a Markdown renderer (GitHub's rule) gives a heading: lower
    case, punctuation dropped, spaces turned into hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The fragments of every heading of the Markdown file ``path``."""
    prose = without_code(path.read_text(encoding="utf-8"))
    return {anchor(m.group(1)) for m in HEADING.finditer(prose)}


def test_the_anchor_rule() -> None:
    assert anchor("Queue mode, bus mode, mixed mode") == "queue-mode-bus-mode-mixed-mode"
    assert anchor("conveyor's tables beside your own Alembic migrations") == (
        "conveyors-tables-beside-your-own-alembic-migrations"
    )
    assert anchor("Partitions: strict FIFO") == "partitions-strict-fifo"


LINKED = [ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *PAGES]


@pytest.mark.parametrize("page", LINKED, ids=[name(p) for p in LINKED])
def test_relative_links_lead_to_a_file_and_a_heading(page: Path) -> None:
    if not page.exists():
        pytest.skip(f"{name(page)} does not exist")
    broken = []
    for match in LINK.finditer(without_code(page.read_text(encoding="utf-8"))):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        path = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{target}: no heading #{fragment} in {path.name}")
    assert broken == [], f"{name(page)} has broken links: {broken}"
