"""Records of the internal task-update topic are checked before `fold` sees them: a malformed one
is a RecordError naming the field, and the runtime dead-letters it and keeps folding the rest."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from astraflow.errors import RecordError
from streams.metrics import Counters
from streams.runtime import StreamsRuntime
from streams.stats import StatsTable, dropped_summary, parse_summary, summarize
from streams.testing import make_group

GOOD = summarize(make_group([1.0, 0.0, 1.0, 0.5], task="t7"))


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_what_the_pipeline_sends_parses_back_unchanged() -> None:
    assert parse_summary(pack(GOOD), b"t7") == GOOD
    dropped = dropped_summary("t7#1", "t7", "arith")
    assert parse_summary(pack(dropped), b"t7") == dropped


POISON = [
    (None, "TaskUpdate.<bytes>: empty record"),
    (b"\xc1 not msgpack", "TaskUpdate.<bytes>: not msgpack"),
    (pack([1, 2, 3]), "TaskUpdate.<bytes>: a list, not a map"),
    (pack({"task": "t7"}), "TaskUpdate.gid: missing"),
    (pack({k: v for k, v in GOOD.items() if k != "env"}), "TaskUpdate.env: missing"),
    (pack({**GOOD, "extra": 1}), "TaskUpdate.extra: unknown field"),
    (pack({**GOOD, "n": "4"}), "TaskUpdate.n: str '4', expected int"),
    (pack({**GOOD, "n": True}), "TaskUpdate.n: bool True, expected int"),
    (pack({**GOOD, "n": -1}), "TaskUpdate.n: -1 out of range"),
    (pack({**GOOD, "reward_sum": math.nan}), "TaskUpdate.reward_sum: nan out of range"),
    (pack({**GOOD, "zero_variance": 1}), "TaskUpdate.zero_variance: int 1, expected bool"),
    (pack({**GOOD, "successes": 9}), "TaskUpdate.successes: 9 exceed n 4"),
    (pack({**GOOD, "task": ""}), "TaskUpdate.task: '' out of range"),
    (pack({**GOOD, "version": -2}), "TaskUpdate.version: -2 out of range"),
    (pack({1: 2}), "TaskUpdate.<bytes>: not msgpack: ValueError: int is not allowed for map key"),
    (b"\x00" * (65 << 10), "TaskUpdate.<bytes>: 66560 bytes exceed 65536"),
]


@pytest.mark.parametrize(("raw", "reason"), POISON)
def test_poison_records_are_refused_naming_the_field(raw: bytes | None, reason: str) -> None:
    with pytest.raises(RecordError) as err:
        parse_summary(raw, b"t7")
    assert str(err.value).startswith(reason), str(err.value)


def test_a_record_under_another_tasks_key_is_refused() -> None:
    with pytest.raises(RecordError, match=r"<key>: Kafka key b'other' is not the task 't7'"):
        parse_summary(pack(GOOD), b"other")


class _Table(dict[str, Any]):
    def set(self, key: str, value: Any, partition: int) -> None:
        self[key] = value

    def delete(self, key: str, partition: int) -> None:
        self.deleted.append((key, partition))
        del self[key]

    def size(self) -> int:
        return len(self)

    def written(self) -> list[Any]:
        return []

    deleted: list[tuple[str, int]]


def _event(raw: bytes | None, key: bytes, offset: int) -> Any:
    msg = SimpleNamespace(topic="ns.streams-task-updates", partition=0, offset=offset, key=key, value=raw)
    return SimpleNamespace(message=msg, value=raw)


def test_the_runtime_dead_letters_poison_and_keeps_folding() -> None:
    sent: list[bytes] = []
    runtime = _runtime(sent)
    events = [_event(raw, b"t7", i) for i, (raw, _) in enumerate(POISON)]
    events.insert(3, _event(pack(GOOD), b"t7", 100))
    events.append(_event(pack(dropped_summary("t7#1", "t7", "arith")), b"t7", 101))

    async def main() -> None:
        for event in events:
            await StreamsRuntime.on_task_update(runtime, event)

    asyncio.run(main())
    letters = runtime.letters
    assert [(a[0], a[2]) for a in letters] == [("ns.streams-task-updates", i) for i in range(len(POISON))]
    for letter, (raw, reason) in zip(letters, POISON, strict=True):
        assert letter[4] == (raw or b"") and letter[5].startswith(reason)
    snap = runtime.counters.snapshot()
    assert snap["task_updates.deadlettered"] == len(POISON) and snap["task_stats.published"] == 2
    state = runtime.stats_table["t7"]
    assert (state["groups"], state["samples"], state["dropped"]) == (2, 4, 1)
    assert sent == [b"t7", b"t7"]


def _runtime(sent: list[bytes], max_task_stats: int = 100) -> Any:
    async def send(key: bytes, value: bytes) -> None:
        sent.append(key)

    letters: list[tuple[Any, ...]] = []
    table = _Table()
    table.deleted = []
    counters = Counters()
    return SimpleNamespace(
        letters=letters,
        last_event=0.0,
        counters=counters,
        stats_table=table,
        stats=StatsTable(table, SimpleNamespace(send=send), counters, max_task_stats),
        dead=SimpleNamespace(publish=lambda *a: letters.append(a)),
        publisher=SimpleNamespace(flush=lambda timeout: 0),
    )


def test_the_task_stats_table_stays_bounded_and_keeps_the_recent_tasks() -> None:
    sent: list[bytes] = []
    runtime = _runtime(sent, max_task_stats=100)

    async def main() -> None:
        for i in range(2_000):  # 20x the bound
            task = f"t{i}"
            summary = summarize(make_group([1.0, 0.0], task=task))
            event = _event(pack(summary), task.encode(), i)
            event.message.partition = i % 3
            await StreamsRuntime.on_task_update(runtime, event)
            assert len(runtime.stats_table) <= 100

    asyncio.run(main())
    table = runtime.stats_table
    evicted = runtime.counters.snapshot()["task_stats.evicted"]
    assert evicted == 2_000 - len(table) and len(table) >= 90
    assert f"t{1999}" in table and "t0" not in table  # the least recently updated went first
    assert min(int(k[1:]) for k in table) == 2_000 - len(table)
    assert all(p == int(k[1:]) % 3 for k, p in table.deleted)  # tombstones to the task's own partition
    assert len(sent) == 2_000


def test_the_trajectory_cache_is_bounded_and_counts_evictions() -> None:
    from streams.bounded import LRU

    counters = Counters()
    cache: LRU[str, int] = LRU(64, lambda: counters.inc("cache.evicted"))
    for i in range(10_000):
        cache[f"x{i}"] = i
        if i % 3 == 0:
            assert cache.get(f"x{i - 60}", -1) in (i - 60, -1)
    assert len(cache) == 64 and cache.evicted == 10_000 - 64
    assert counters.snapshot()["cache.evicted"] == 10_000 - 64
    assert "x9999" in cache and cache["x9936"] == 9936 and "x9935" not in cache
    assert cache.pop("x9999") == 9999 and cache.pop("x9999") is None


def _sink(hops: list[tuple[bytes, Any]], published: list[bytes], table: _Table) -> Any:
    from streams.sink import KafkaSink

    async def hop(key: bytes, value: Any) -> str:
        hops.append((key, value))
        return "delivery"

    async def publish(key: bytes, value: bytes) -> str:
        published.append(key)
        return "delivery"

    stats = StatsTable(table, SimpleNamespace(send=publish), Counters(), 100)
    updates = SimpleNamespace(partitions=8, send=hop)
    return KafkaSink(None, {}, updates, [], None, None, None, stats)  # type: ignore[arg-type]


def test_a_group_from_its_tasks_partition_is_folded_in_place_and_any_other_goes_through_the_topic() -> None:
    from astraflow.kafka import partition_for

    hops: list[tuple[bytes, Any]] = []
    published: list[bytes] = []
    table = _Table()
    sink = _sink(hops, published, table)
    own = partition_for("t7", 8)
    other = (own + 1) % 8

    async def main() -> None:
        assert await sink.send_summary(GOOD, own) == []  # the table's writes (none in this fake)
        assert (table["t7"]["groups"], table["t7"]["p"], hops, published) == (1, own, [], [])
        await sink.publish_stats()  # after the batch's Samples: the task's newest TaskStats
        assert published == [b"t7"]
        await sink.send_summary(GOOD, own)  # the same group again (emitted again after a crash)
        assert table["t7"]["groups"] == 1 and sink.stats.counters.snapshot()["task_stats.duplicates"] == 1
        await sink.publish_stats()  # ... publishes its task again: the first may have died with it
        assert published == [b"t7", b"t7"]
        later = summarize(make_group([0.0, 0.0], task="t7", attempt=1))
        assert await sink.send_summary(later, other) == ["delivery"]  # another partition's owner folds it
        assert hops == [(b"t7", later)] and table["t7"]["groups"] == 1
        await sink.publish_stats()
        assert published == [b"t7", b"t7"]

    asyncio.run(main())
    assert sink.stats.counters.snapshot()["task_stats.folded_at_emission"] == 2


def test_after_a_start_or_rebalance_the_tasks_of_the_partitions_it_brought_are_published_again() -> None:
    published: list[bytes] = []
    table = _Table()
    for i in range(6):
        table[f"t{i}"] = {**GOOD_STATE, "p": i % 3}
    sink = _sink([], published, table)

    async def main() -> None:
        sink.stats.republish({1, 2})
        assert await sink.stats.publish(most=3) == 3 and published == [b"t1", b"t2", b"t4"]
        await sink.publish_stats()
        assert published == [b"t1", b"t2", b"t4", b"t5"]
        await sink.publish_stats()
        assert len(published) == 4  # nothing left to publish

    asyncio.run(main())


GOOD_STATE = {
    "groups": 1,
    "samples": 4,
    "reward_sum": 2.5,
    "successes": 2,
    "zero_variance": 0,
    "dropped": 0,
    "version": 0,
    "recent": ["t7#0"],
    "env": "arith",
}
