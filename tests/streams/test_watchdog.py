"""EndsSeen, the watchdog's memory of the partitions' ends (streams/runtime.py): looked at every sweep,
it hands back the ends of a look once they are a commit interval old with no event since."""

from __future__ import annotations

from streams.runtime import EndsSeen


def test_ends_come_back_once_old_enough_though_the_sweep_looks_every_half_second() -> None:
    # the watchdog kept only its last look and compared against it: at a sweep every 0.5 s that
    # look was never 2 s old, and a partition faust had stopped fetching was never re-sought
    seen = EndsSeen(2.0)
    got = []
    for i in range(10):
        now = 0.5 * i
        if seen.due(now, last_event=-10.0):
            got.append((now, seen.look(now, -10.0, {"p0": 100 + i})))
    assert got[0] == (0.0, None)
    assert (2.0, {"p0": 100}) in got  # the first look's ends, not the newest
    assert sum(ends is not None for _, ends in got) >= 2


def test_an_event_since_the_look_starts_a_new_one() -> None:
    seen = EndsSeen(2.0)
    assert seen.look(0.0, last_event=-1.0, ends={"p0": 5}) is None
    assert seen.look(2.5, last_event=1.0, ends={"p0": 9}) is None  # an event at 1.0: a new look
    assert not seen.due(3.0, last_event=1.0)
    assert seen.due(4.5, last_event=1.0)
    assert seen.look(4.5, last_event=1.0, ends={"p0": 12}) == {"p0": 9}


def test_nothing_is_asked_before_the_look_is_old_enough() -> None:
    seen = EndsSeen(2.0)
    assert seen.due(0.0, 0.0)
    seen.look(0.0, 0.0, {"p0": 1})
    assert [seen.due(t, 0.0) for t in (0.5, 1.0, 1.5, 1.9, 2.0)] == [False] * 4 + [True]
