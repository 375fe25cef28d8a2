"""Shared fixtures: a temporary home, and a running writer shared by the tests that only talk to it."""

from __future__ import annotations

import pytest

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
