"""The statement catalogue (:mod:`conveyor.store.catalogue`) against each dialect's
SQL files: every statement a dialect has is in the catalogue (or serves one of its
hooks), and every catalogue statement is in both dialects."""

from __future__ import annotations

import pytest

from conveyor.store import catalogue
from conveyor.store.protocol import texts

DIALECTS = {"sqlite": "conveyor.store.sqlite", "postgres": "conveyor.store.postgres"}


def _own(dialect: str) -> set[str]:
    return set(texts.load(DIALECTS[dialect]))


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_a_dialect_has_no_statement_the_catalogue_does_not_name(dialect: str) -> None:
    known = set(catalogue.names())
    hooks = {f"{hook}." for hook in catalogue.HOOKS}
    extra = {n for n in _own(dialect) - known if not any(n.startswith(h) for h in hooks)}
    assert extra == set()


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_a_dialect_has_every_catalogue_statement(dialect: str) -> None:
    assert set(catalogue.names()) - _own(dialect) == set()


def test_every_statement_has_a_contract_and_a_role() -> None:
    from importlib import util

    for entry in catalogue.STATEMENTS:
        assert len(entry.contract) > 20, entry.name
        assert util.find_spec(f"conveyor.store.protocol.{entry.role}") is not None, entry
    assert len(set(catalogue.names())) == len(catalogue.STATEMENTS)


def test_the_claim_hook_is_an_abstract_seam_method_each_dialect_implements() -> None:
    from conveyor.store.postgres import PostgresStore
    from conveyor.store.seam import Seam
    from conveyor.store.sqlite import SQLiteStore

    assert "claim" in catalogue.HOOKS
    assert "_claim" in Seam.__abstractmethods__
    for store in (SQLiteStore, PostgresStore):
        assert store._claim is not Seam._claim, store
    for dialect in DIALECTS:
        # Its statements are the dialect's own, named for it.
        assert any(name.startswith("claim.") for name in _own(dialect)), dialect
