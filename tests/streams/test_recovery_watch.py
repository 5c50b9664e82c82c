"""RecoveryWatch: a table recovery that reads nothing for `stall_s` with records left ends the worker;
one that reads, however slowly, or that has nothing left to read, does not."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from faust.tables.recovery import Recovery
from faust.types import TP

from streams.recovery_watch import RecoveryWatch

GROUPS = TP("streams-groups-changelog", 2)
BODIES = TP("streams-bodies-changelog", 5)


class FakeRecovery:
    """What RecoveryWatch reads of faust's Recovery, with its own `active_remaining`."""

    active_remaining = Recovery.active_remaining

    def __init__(self) -> None:
        self.in_recovery = True
        self.active_highwaters: Counter[TP] = Counter({GROUPS: 15, BODIES: 9})
        self.active_offsets: Counter[TP] = Counter({GROUPS: -1, BODIES: 9})


def watch(stall_s: float = 10.0) -> tuple[RecoveryWatch, FakeRecovery, list[str]]:
    rec = FakeRecovery()
    stalls: list[str] = []
    app: Any = SimpleNamespace(tables=SimpleNamespace(recovery=rec))
    return RecoveryWatch(app, stall_s, stalls.append), rec, stalls


def test_a_recovery_that_reads_nothing_for_stall_s_ends_the_worker_naming_what_is_stuck() -> None:
    w, _, stalls = watch()
    for now in (0.0, 5.0, 9.9):
        w.check(now)
    assert stalls == []
    w.check(10.0)
    assert len(stalls) == 1
    assert "read no changelog record for 10 s with 16 left to read" in stalls[0]
    assert "streams-groups-changelog[2] at -1 of 15" in stalls[0]
    assert "bodies" not in stalls[0]  # read to its end


def test_a_recovery_that_reads_slowly_is_never_cut_short() -> None:
    w, rec, stalls = watch()
    for step in range(1, 16):
        rec.active_offsets[GROUPS] = step - 1  # one record every 9 s
        w.check(9.0 * step)
    assert stalls == []
    w.check(9.0 * 15 + 10.0)  # then nothing for 10 s
    assert len(stalls) == 1 and "with 1 left to read" in stalls[0]


def test_no_recovery_or_nothing_left_to_read_is_no_stall() -> None:
    w, rec, stalls = watch()
    rec.in_recovery = False
    for now in range(0, 100, 5):
        w.check(float(now))
    rec.in_recovery = True
    rec.active_offsets[GROUPS] = 15
    for now in range(100, 200, 5):
        w.check(float(now))
    assert stalls == []


def test_the_clock_starts_again_after_a_recovery_ends() -> None:
    w, rec, stalls = watch()
    w.check(0.0)
    rec.in_recovery = False
    w.check(8.0)
    rec.in_recovery = True  # the next rebalance's recovery, from the same offsets
    w.check(9.0)
    w.check(18.0)
    assert stalls == []
    w.check(19.0)
    assert len(stalls) == 1
