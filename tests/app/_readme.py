"""The documentation's code blocks, by section (shared by the tests that run them).

A section is found by its ``## Heading`` in README.md or any page of docs/
(:mod:`_docs`), so it may move between pages without touching its tests.
"""

from __future__ import annotations

from _docs import blocks

__all__ = ["blocks"]
