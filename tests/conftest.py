"""Shared fixtures: a temporary home, a running writer shared by the tests that only talk to it, and a
migrated database file to copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from common import db
from common.stores import schema_store
from tests.procs import Home, make_home, remove_home, start_writer


@pytest.fixture
def home() -> Home:
    h = make_home()
    yield h
    remove_home(h)


@pytest.fixture(scope="module")
def writer_home() -> Home:
    """One writer per test module: tests that only send requests share it (each uses its own chats)."""
    h = make_home()
    proc = start_writer(h)
    yield h
    proc.stop()
    remove_home(h)


@pytest.fixture(scope="module")
def migrated_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database migrated once per module; tests copy it (migrating costs many fsyncs)."""
    path = tmp_path_factory.mktemp("template") / "starling.db"
    c = db.open_writer(path)
    schema_store.migrate(c, path)
    c.close()
    return path
