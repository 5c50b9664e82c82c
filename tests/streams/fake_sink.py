"""An in-process stand-in for Kafka under the emitter: a `Sink` that records every write and wait,
and a `Broker` that keeps what survives a crash (in the spirit of Faust's `test_context`).

Durability follows the real producers. Faust's producer runs on the event loop: what the code
produces between two awaits stays in the process (`buffered`) until the next await lets the loop
send it (`pending`, in flight), and a record is durable once acknowledged: its delivery awaited
(which acknowledges the records before it on the same topic-partition too: the idempotent producer
keeps their order), or `send_now` (everything produced so far). Dead letters go through
confluent-kafka, whose own thread sends them at once; `flush_dead` makes them durable.

`crash_at=k` kills the process as its k-th step (a write, an await, a read-back) starts. The
buffered records die with it; of the ones in flight, `keep` decides which reached the broker
anyway. Records of different topics travel in different produce requests, so any split is
possible; the five of `KEEP` are the extremes (none, all, only table changelogs, only topic
records) and the split between the two tables of streams/grouping.py (only the bodies' changelog).
`before_crash`, if set, runs just before the crash: an offset commit there (its flush makes every
record produced so far durable) is what a crash leaves at the other extreme.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from astraflow.records import SampleBatch, decode, samples_of
from streams.plan import Letter
from streams.stats import TaskSummary

CHANGELOG = "changelog."  # the topic of table NAME is CHANGELOG + NAME
DEADLETTER = "deadletter"
TASK_UPDATES = "task-updates"


class Crash(BaseException):
    """The process died here (a BaseException, so no `except Exception` of the code under test
    survives it)."""


@dataclass(frozen=True)
class Write:
    topic: str
    partition: int
    key: Any
    value: Any


KEEP: dict[str, Callable[[Write], bool]] = {
    "none": lambda w: False,
    "all": lambda w: True,
    "tables": lambda w: w.topic.startswith(CHANGELOG),
    "records": lambda w: not w.topic.startswith(CHANGELOG),
    "bodies": lambda w: w.topic == CHANGELOG + "bodies",
}


@dataclass
class Broker:
    """The durable writes, in the order they became durable."""

    log: list[Write] = field(default_factory=list)

    def table(self, name: str) -> dict[Any, Any]:
        """The table as its changelog rebuilds it after a restart."""
        data: dict[Any, Any] = {}
        for w in self.records(CHANGELOG + name):
            if w.value is None:
                data.pop(w.key, None)
            else:
                data[w.key] = w.value
        return data

    def records(self, topic: str) -> list[Write]:
        return [w for w in self.log if w.topic == topic]

    def samples(self, topic: str) -> list[Any]:
        """The Samples on a samples topic, SampleBatches opened."""
        return [s for w in self.records(topic) for s in samples_of(decode(w.value, (SampleBatch,)))]


class FakeSink:
    """The emitter's Sink over a Broker. `steps` names every step taken, in order."""

    def __init__(
        self, broker: Broker, crash_at: int | None = None, keep: Callable[[Write], bool] = KEEP["none"]
    ) -> None:
        self.broker, self.crash_at, self.keep = broker, crash_at, keep
        self.buffered: list[Write] = []  # produced since the last await: still in this process
        self.pending: list[Write] = []  # in flight: may reach the broker even if the process dies
        self.steps: list[str] = []
        self.crashed = False
        self.before_crash: Callable[[], None] | None = None
        self.table_writes: list[Awaitable[Any]] = []  # deliveries `written` has not handed out yet

    # the process, step by step

    def step(self, name: str, awaits: bool) -> None:
        """Take a step; one that `awaits` lets the event loop send what was buffered."""
        if self.crashed:
            raise Crash("already dead")
        if awaits:
            self.pending += self.buffered
            self.buffered = []
        self.steps.append(name)
        if len(self.steps) == self.crash_at:
            if self.before_crash is not None:
                self.before_crash()
            self.crashed = True
            self.broker.log += [w for w in self.pending if self.keep(w)]
            self.pending, self.buffered = [], []
            raise Crash(f"crashed at step {self.crash_at}: {name}")

    def produce(self, write: Write, awaits: bool = False) -> Delivery:
        self.step(f"write {write.topic}[{write.partition}] {write.key!r}", awaits)
        self.buffered.append(write)
        return Delivery(self, write)

    def durable(self, which: Callable[[Write], bool]) -> None:
        self.pending += self.buffered
        self.broker.log += [w for w in self.pending if which(w)]
        self.pending, self.buffered = [w for w in self.pending if not which(w)], []

    def acknowledge(self, write: Write) -> None:
        self.step(f"ack {write.topic}[{write.partition}] {write.key!r}", awaits=True)
        upto = next((i for i, w in enumerate(self.pending) if w is write), -1)
        before = {id(w) for w in self.pending[: upto + 1]}
        self.durable(lambda w: id(w) in before and (w.topic, w.partition) == (write.topic, write.partition))

    # the Sink

    def written(self) -> list[Awaitable[Any]]:
        out, self.table_writes = self.table_writes, []
        return out

    async def send(self, topic: str, partition: int, key: bytes, value: bytes) -> Awaitable[Any]:
        return self.produce(Write(topic, partition, key, value), awaits=True)

    async def send_summary(self, summary: TaskSummary, partition: int) -> list[Awaitable[Any]]:
        return [self.produce(Write(TASK_UPDATES, 0, summary["task"].encode(), dict(summary)), awaits=True)]

    async def publish_stats(self) -> None:
        pass  # the statistics are not part of the emission protocol: their table writes are

    def deadletter(self, letter: Letter) -> None:
        write = Write(DEADLETTER, 0, letter.key, letter)
        self.step(f"write {DEADLETTER} {letter.key!r}", awaits=False)
        self.pending.append(write)  # confluent-kafka's thread sends it, whatever the event loop does

    async def flush_dead(self) -> None:
        self.step("flush deadletter", awaits=True)
        self.durable(lambda w: w.topic == DEADLETTER)

    async def send_now(self) -> None:
        self.step("send now", awaits=True)
        self.durable(lambda w: w.topic != DEADLETTER)

    async def read_back(
        self, targets: Iterable[tuple[str, int]], keys: set[str], since: float
    ) -> set[tuple[str, str]]:
        self.step("read back", awaits=True)  # `since` is not modelled: every durable record is read
        wanted, names = set(targets), {k.encode() for k in keys}
        return {
            (w.topic, s.traj_id)
            for w in self.broker.log
            if (w.topic, w.partition) in wanted and w.key in names
            for s in samples_of(decode(w.value, (SampleBatch,)))
        }


@dataclass(eq=False)  # gather() hashes what it awaits
class Delivery:
    """A produced record's acknowledgement: awaiting it waits for the broker."""

    sink: FakeSink
    write: Write

    def __await__(self) -> Iterator[Any]:
        return self._wait().__await__()

    async def _wait(self) -> None:
        self.sink.acknowledge(self.write)


class FakeTable:
    """A `streams.grouping.Table` whose writes go to its changelog through the sink, like
    streams.faust_glue.FaustTable (the local data changes at once; `written` hands out deliveries)."""

    def __init__(self, name: str, sink: FakeSink, data: dict[Any, Any]) -> None:
        self.name, self.sink, self.data = name, sink, data

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def set(self, key: str, value: Any, partition: int) -> None:
        self.data[key] = value
        self.sink.table_writes.append(self.sink.produce(Write(CHANGELOG + self.name, partition, key, value)))

    def delete(self, key: str, partition: int) -> None:
        self.data.pop(key, None)
        self.sink.table_writes.append(self.sink.produce(Write(CHANGELOG + self.name, partition, key, None)))

    def set_local(self, key: str, value: Any) -> None:
        self.data[key] = value

    def delete_local(self, key: str) -> None:
        self.data.pop(key, None)

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(list(self.data.items()))
