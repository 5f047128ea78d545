"""The project's documentation pages and their code blocks, for the tests that run
them (imported as ``_docs``: pytest puts ``tests/`` on ``sys.path``).

The pages are README.md and every Markdown file under docs/, README first, then
docs/ in path order. A section is a ``## Heading`` and what follows it up to the
next ``## `` heading; its heading is unique across the pages, so a section moved
from one page to another is still found by its heading alone.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)


def pages() -> list[Path]:
    """README.md, then every ``docs/**/*.md``, in path order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def name(page: Path) -> str:
    """The page's path from the repository's root, with ``/`` separators."""
    return page.relative_to(ROOT).as_posix()


def without_code(text: str) -> str:
    """``text`` with its fenced code blocks blanked out (every offset kept), so a
    ``# comment`` in a block is not read as a heading, nor ``[x](y)`` as a link."""
    return _FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def section(heading: str) -> tuple[Path, str]:
    """The page holding the section ``## heading``, and the section's text."""
    found: list[tuple[Path, str]] = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        prose = "\n" + without_code(text)  # offset n here is n - 1 in text
        start = prose.find(f"\n## {heading}\n")
        if start == -1:
            continue
        end = prose.find("\n## ", start + 1)
        found.append((page, text[start : end - 1 if end != -1 else len(text)]))
    if len(found) != 1:
        where = ", ".join(name(page) for page, _ in found) or "no page"
        raise LookupError(f"section '## {heading}' is in {where}; it must be in exactly one")
    return found[0]


def blocks(heading: str, language: str = "python") -> list[str]:
    """The ``language`` code blocks of the section ``## heading``, wherever it is."""
    _, body = section(heading)
    return re.findall(rf"^```{language}\n(.*?)^```", body, flags=re.S | re.M)
