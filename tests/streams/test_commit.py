"""Offset commits of the streams' Faust consumer: never past a record that was not processed."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from intervaltree import IntervalTree

from streams.faust_glue import _StrictConsumer, next_commit


@pytest.mark.parametrize(
    ("acked", "committed", "want"),
    [
        ([], 10, (None, 0)),
        ([10, 11, 12], 10, (13, 3)),
        ([10, 11, 12, 14, 15], 10, (13, 3)),  # stops at the hole at 13
        ([11, 12], 10, (None, 0)),  # the record at the committed offset itself is missing
        ([8, 9, 10, 11], 10, (12, 4)),  # below the committed offset: already done, dropped
        ([8, 9], 10, (None, 2)),
        ([3, 4, 6], None, (5, 2)),  # nothing committed yet: from the first processed offset
        ([0, 1], 0, (2, 2)),  # 0 is a committed offset, not "none"
    ],
)
def test_next_commit(acked: list[int], committed: int | None, want: tuple[int | None, int]) -> None:
    assert next_commit(acked, committed) == want


def bare_consumer(cls: type, committed: int, acked: list[int], gap: tuple[int, int] | None) -> tuple[Any, TP]:
    """A faust consumer object holding only the bookkeeping that `_new_offset` reads."""
    tp = TP("trajectories", 0)
    consumer = object.__new__(cls)
    consumer._acked = defaultdict(list, {tp: list(acked)})
    consumer._acked_index = defaultdict(set, {tp: set(acked)})
    consumer._committed_offset = defaultdict(lambda: None, {tp: committed})
    consumer._gap = defaultdict(IntervalTree)
    if gap is not None:
        consumer._gap[tp].addi(*gap)
    return consumer, tp


@pytest.mark.parametrize(
    ("acked", "gap", "faust_commits"),
    [
        # 20 was never delivered (fetched around a rebalance and dropped); 21 was processed
        ([21, 22], None, 23),
        # 20..24 skipped: faust saw the jump from its read offset 20 to 25 and recorded 21..25 as a gap
        ([25, 26], (21, 26), 26),
    ],
)
def test_a_record_that_was_never_processed_holds_the_commit(
    acked: list[int], gap: tuple[int, int] | None, faust_commits: int
) -> None:
    faust, tp = bare_consumer(faust_aiokafka.Consumer, 20, acked, gap)
    assert faust._new_offset(tp) == faust_commits  # faust 0.15.3 commits past offset 20: it is lost
    strict, tp = bare_consumer(_StrictConsumer, 20, acked, gap)
    assert strict._new_offset(tp) is None
    assert strict._acked[tp] == acked  # still waiting for 20
    strict._acked[tp].append(20)
    strict._acked_index[tp].add(20)
    assert strict._new_offset(tp) == (max(acked) + 1 if gap is None else 21)
    assert strict._acked[tp] == ([] if gap is None else acked)
