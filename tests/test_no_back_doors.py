"""Code of conveyor outside ``conveyor.store`` uses the store's public methods or
its documented internal ones (``store.internal``), never its private attributes.

The scan reads the source (no database): every attribute access, and every
``getattr``/``setattr``/``hasattr`` with a literal name, whose name is one of the
private names a store has (its classes' and a fresh instance's, the blocking
facade's too), on anything but the bare ``self``/``cls`` of the class that
defines it. The allowlist is empty.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

import pytest

import conveyor
from conveyor.store.api_internal import Internal
from conveyor.store.base import TaskStore
from conveyor.store.postgres import PostgresStore
from conveyor.store.sqlite import SQLiteStore
from conveyor.sync_store import SyncInternal, SyncStore

SRC = Path(conveyor.__file__).parent
STORE_PACKAGE = SRC / "store"
ALLOWED: set[tuple[str, str]] = set()  # (path, name): none


def _private(names: Iterable[str]) -> set[str]:
    return {n for n in names if n.startswith("_") and not n.endswith("__")}


@functools.cache
def private_store_names() -> set[str]:
    """Every private name of a store: class attributes of each store class (and
    their bases), and what a fresh instance sets in ``__init__``."""
    names: set[str] = set()
    for cls in (TaskStore, SQLiteStore, PostgresStore, SyncStore, Internal, SyncInternal):
        names |= _private(dir(cls))
    for store in (
        conveyor.connect("sqlite:///never-opened.db"),
        conveyor.connect("postgresql://nobody@db.invalid/never"),
    ):  # no I/O happens before open()
        names |= _private(vars(store))
        names |= _private(vars(store.internal))
    sync = conveyor.connect_sync("sqlite:///never-opened.db")
    names |= _private(vars(sync)) | _private(vars(sync.internal))
    return names


def outside_store() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if STORE_PACKAGE not in p.parents)


def private_reads(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """``(line, expression)`` of each read of a name in ``names`` in ``path``,
    other than on a bare ``self`` or ``cls``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in names:
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in names
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_scan_knows_the_store_private_names() -> None:
    """The scan is only as good as its list: it must hold the names it exists for."""
    names = private_store_names()
    assert {"_run", "_upsert", "_current_now_us", "_engine", "_call"} <= names
    # A name with no underscore is public (or internal): never in the list.
    assert "internal" not in names and "maintain" not in names


def test_the_scan_finds_a_private_read(tmp_path: Path) -> None:
    """What the scan says of code that reads the store as the scheduler once did."""
    sample = (
        "async def f(store, app):\n"
        "    await store._run(work)\n"
        "    app.store._known_groups.add(x)\n"
        "    getattr(store, '_engine')\n"
        "    self._run(x)\n"
    )
    path = tmp_path / "sample.py"
    path.write_text(sample, encoding="utf-8")
    found = private_reads(path, private_store_names())
    assert sorted(line for line, _ in found) == [2, 3, 4]


@pytest.mark.parametrize("path", outside_store(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_store_attribute_outside_the_store(path: Path) -> None:
    rel = str(path.relative_to(SRC))
    reads = [
        (line, expr)
        for line, expr in private_reads(path, private_store_names())
        if (rel, expr.rsplit(".", 1)[-1]) not in ALLOWED
    ]
    assert reads == [], (
        f"{rel} reads private store attributes {reads}: call a public method of the "
        "store, or add a documented one to store.internal (conveyor/store/api_internal.py)"
    )
