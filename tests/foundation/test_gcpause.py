"""The collector of the long-running components: paused while they start, then the start's objects
frozen and the collector on again (astraflow/gcpause.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from astraflow import gcpause


@pytest.fixture(autouse=True)
def restore_gc() -> Iterator[None]:
    yield
    gc.enable()
    gc.unfreeze()
    gcpause._paused = False  # noqa: SLF001 - the module's own state, reset between tests


@pytest.mark.parametrize("command", sorted(gcpause.LONG_RUNNING))
def test_a_component_starts_paused_and_settles_once_with_its_start_frozen(command: str) -> None:
    gcpause.pause(command)
    assert not gc.isenabled()
    start = [[] for _ in range(100)]  # what a component builds while it starts
    assert gc.get_freeze_count() == 0
    gcpause.settle()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(start)  # the start's objects are out of every collection
    assert all(gc.is_tracked(obj) for obj in start)
    frozen = gc.get_freeze_count()
    later = [[] for _ in range(100)]  # what a second freeze would take in
    gcpause.settle()  # a second call changes nothing
    # at most: frozen objects that another thread of this process lets go meanwhile leave the count
    # (it fell by 2 in a CI run), and a second freeze would have added `later`
    assert gc.isenabled() and gc.get_freeze_count() <= frozen
    assert all(gc.is_tracked(obj) for obj in later)


@pytest.mark.parametrize("command", ["topics", "broker", "status", None])
def test_short_commands_and_other_processes_keep_the_collector(command: str | None) -> None:
    gcpause.pause(command)
    assert gc.isenabled()
    gcpause.settle()  # e.g. a test running a component in process: nothing to undo, nothing frozen
    assert gc.isenabled() and gc.get_freeze_count() == 0
