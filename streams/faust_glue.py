"""The few things Faust needs from us: a msgpack codec, an idempotent producer, and a table
adapter whose writes name their changelog partition.

- Codec `msgpack` (registered with `faust.serializers.codecs`): table keys and values, and the
  internal task-update topic. Wire records themselves travel as `raw` bytes encoded by
  astraflow.records, so Faust never re-serialises them.
- `AstraFaustApp`: faust.App whose aiokafka producer runs with `enable_idempotence` and acks=all
  (faust only turns that on for its exactly_once mode), so a retried send cannot duplicate, and
  whose flush does not return before faust's own send buffer is empty (see
  `_IdempotentProducer.flush`), and whose consumer commits an offset only when every record
  before it was processed (`_StrictConsumer`). The other faust 0.15.3 problem the SIGKILL tests
  found, records fetched around a rebalance and never delivered, is handled by
  `StreamsRuntime.watchdog`.
- `QuietWorker`: faust.Worker without the start-up spinner, which sets the root logger to DEBUG
  for good, so that every `log.debug` in faust and aiokafka built a LogRecord that the handlers
  then dropped (~8% of the streams worker's CPU in a training run).
- `make_table`: a faust Table whose changelog really uses the codecs it is given.
- `check_versions`: the app refuses a faust-streaming, mode-streaming or aiokafka release that these
  overrides of their private code were not checked against (`TESTED`), or one without a private
  method they override or call (`LEANED_ON`), instead of breaking silently.

Every override of private faust, mode or aiokafka code lives in this module, and says at the
override which faust bug or limitation it works around.
- `FaustTable`: the `Table` protocol of streams/grouping.py over a faust Table. Faust's own
  `table[key] = value` takes the changelog partition from the current event and so refuses to
  work in a timer; the group timeout sweep runs in a timer, and every group entry already knows
  its partition (that of the `trajectories` partition its trajectories came from), so writes go
  to that partition explicitly, from the agent and the timer alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

import faust
import msgpack
from aiokafka.producer.message_accumulator import MessageAccumulator
from faust.serializers import codecs
from faust.tables.recovery import Recovery
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer
from mode import Service

#: The releases whose internals the overrides here were read against and the crash tests ran with.
#: `_IdempotentProducer` (`_settings_extra`, `buffer` and its `_send_pending` and `_handle_pending`,
#: `_producer`, aiokafka's
#: `_message_accumulator.flush_for_commit`), `_StrictConsumer` (`_new_offset`, `_gap`, `_acked`,
#: `_acked_index`, `_committed_offset`), `AstraFaustApp` (`_new_transport`,
#: `_new_producer_transport`), `_ConsumerThread` (`_create_worker_consumer`, aiokafka's
#: `_fetch_max_wait_ms`), `QuietWorker` (mode's `_sentinel_task`, `_crash`, `_stopped`) and
#: `make_table` (`_new_changelog_topic`) lean on private code that a new release may move without
#: a word; the exactly-once protocol would then break silently. streams/recovery_watch.py reads
#: the table recovery's `in_recovery`, `active_offsets` and `active_highwaters`.
TESTED = {"faust-streaming": ("0.15.3",), "mode-streaming": ("0.7.1",), "aiokafka": ("0.13", "0.14")}

#: The private methods overridden or called here, on the classes that define them: a release that
#: drops one would turn its override into dead code (instance attributes are covered by `TESTED`).
LEANED_ON = (
    (faust_aiokafka.Producer, "_settings_extra"),
    (faust_aiokafka.Consumer, "_new_offset"),
    (faust_aiokafka.Consumer, "_new_consumer_thread"),
    (faust_aiokafka.AIOKafkaConsumerThread, "_create_worker_consumer"),
    (faust.App, "_new_transport"),
    (faust.App, "_new_producer_transport"),
    (faust.Worker, "_sentinel_task"),
    (faust.Worker, "_crash"),
    (faust.Table, "_new_changelog_topic"),
    (MessageAccumulator, "flush_for_commit"),
    (ProducerBuffer, "_send_pending"),
    (Recovery, "active_remaining"),
)


def check_versions(
    installed: dict[str, str] | None = None, leaned_on: tuple[tuple[type, str], ...] = LEANED_ON
) -> None:
    """Refuse to run on a faust-streaming, mode-streaming or aiokafka release these overrides were
    not checked against (`TESTED`), naming it: review the overrides against it, then add it to
    `TESTED`. Refuse as well if a private method they rely on is gone."""
    from astraflow.errors import ConfigError

    for package, releases in TESTED.items():
        version = (installed or {}).get(package) or metadata.version(package)
        if not any(version == r or version.startswith(r + ".") for r in releases):
            raise ConfigError(
                f"streams: {package} {version} is installed, but streams/faust_glue.py overrides private "
                f"code of {package} {' or '.join(releases)} (the commit protocol, the producer's flush, the "
                f"tables' codecs): check those overrides against {version}, then add it to TESTED there"
            )
    for owner, name in leaned_on:
        if not callable(getattr(owner, name, None)):
            raise ConfigError(
                f"streams: {owner.__module__}.{owner.__qualname__}.{name} is gone, and streams/faust_glue.py "
                f"overrides or calls it: port the override to the installed release"
            )


class MsgpackCodec(codecs.Codec):
    def _dumps(self, obj: Any) -> bytes:
        return msgpack.packb(obj, use_bin_type=True)

    def _loads(self, s: bytes) -> Any:
        return msgpack.unpackb(s, raw=False, strict_map_key=True)


def register_codec() -> None:
    if "msgpack" not in codecs.codecs:
        codecs.register("msgpack", MsgpackCodec())


class _DrainableBuffer(ProducerBuffer):
    """faust's ProducerBuffer (what table writes go through), which can tell when every message put
    into it has reached aiokafka.

    faust 0.15.3's buffer task takes a message off its queue, then awaits handing it to aiokafka
    (`_handle_pending`, `_send_pending`); meanwhile the buffer's size is already 0, so a flush
    that waits for the size returned with the last table write still in that task's hands. The
    flush for a commit then waited for everything but that write, and `send_now` closed aiokafka's
    batches without it: the write then sat out the producer's linger, so each emission's intent
    took ~20 ms more to be acknowledged (`streams.producer_linger_ms`; measured: 4.4 ms p50 to the
    end of `send_now`, 25 ms p50 to the intents' acknowledgement, on guess_number)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.handed = asyncio.Event()  # set: no message between the queue and aiokafka
        self.handed.set()

    async def _send_pending(self, fut: Any) -> None:
        self.handed.clear()  # in the step that took it off the queue: no moment where none shows
        try:
            await super()._send_pending(fut)
        finally:
            self.handed.set()

    async def drain(self) -> None:
        """Return once every message put so far is in aiokafka's hands."""
        while self.size or not self.handed.is_set():
            if self.size:
                await self.flush()
            else:
                await self.handed.wait()


class _IdempotentProducer(faust_aiokafka.Producer):
    buffer: _DrainableBuffer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.app.conf.producer_threaded:  # its buffer feeds another loop's queue: not drainable here
            raise ValueError("the streams' producer must not be threaded (producer_threaded)")
        self.buffer = _DrainableBuffer(loop=self.loop, beacon=self.beacon)
        self.buffer.app = self.app  # what faust's own __init__ gives its buffer

    def _settings_extra(self) -> Any:
        """faust 0.15.3 (`Producer._settings_extra`) asks for acks=all and idempotence only inside
        a transaction (processing_guarantee exactly_once, which the streams do not use: the
        protocol of streams/emit.py does without transactions); otherwise a produce request that
        is retried after a lost answer could append a Sample twice."""
        return {**super()._settings_extra(), "acks": "all", "enable_idempotence": True}

    async def flush(self) -> None:
        """Flush until faust's ProducerBuffer is really empty, then aiokafka's accumulator.

        faust's `ProducerBuffer.flush()` returns as soon as 0.1 s pass without a message leaving
        the buffer, even if messages remain (faust/transport/producer.py, `flush_atmost`); the
        consumer calls this flush right before it commits offsets, so a table write could still
        be waiting in the buffer when its source offset is committed, and a SIGKILL would then
        lose it. Found by reading the code, not by a failing test. The buffer's task may also still
        hold the last message it took (`_DrainableBuffer`)."""
        await self.buffer.drain()
        await super().flush()

    async def send_now(self) -> None:
        """Send every buffered record now and wait for the broker's acknowledgements.

        The producer lingers (`streams.producer_linger_ms`) so that the many small changelog writes
        between two emissions share one produce request; a group's emission, which must wait for
        its intent and then its Samples to be acknowledged, ends that linger here instead of
        waiting it out. aiokafka has no public "send now": `flush_for_commit` (written for
        transactions; aiokafka 0.10-0.14) closes every open batch, wakes the sender and waits
        for them, which is exactly that."""
        await self.buffer.drain()
        producer = self._producer
        if producer is not None:
            await producer._message_accumulator.flush_for_commit()


def next_commit(acked: list[int], committed: int | None) -> tuple[int | None, int]:
    """The offset to commit given the processed (acked) offsets, sorted, and the committed one.

    Returns (offset, n): commit `offset` and drop the first `n` entries of `acked`; offset None
    means nothing can be committed yet. Only a run of processed offsets that starts exactly at
    the committed offset moves it: a record that was never processed holds the commit back, so
    a restart (or the watchdog's re-seek) delivers it again. With nothing committed yet
    (committed None) the run starts at the first processed offset, as faust does."""
    if not acked:
        return None, 0
    expect = acked[0] if committed is None else committed
    i = 0
    while i < len(acked) and acked[i] <= expect:
        if acked[i] == expect:
            expect += 1
        i += 1
    if committed is not None and expect == committed:
        return None, i
    return expect, i


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's aiokafka consumer, with the app's `fetch_max_wait_ms` (streams.fetch_max_wait_ms)
    instead of the 1,500 ms faust 0.15.3 hard-codes (`_create_worker_consumer`). aiokafka keeps one
    fetch in flight per broker, and a fetch leaves out the partitions whose records the app has not
    taken yet; a record that then arrives on one of those waits for the fetch in flight to end. With
    1.5 s, a streams worker that had just drained a burst held the next groups 0.3-0.9 s
    (bench/RESULTS.md, "Streams")."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = getattr(self.app, "fetch_max_wait_ms", consumer._fetch_max_wait_ms)
        return consumer


class _StrictConsumer(faust_aiokafka.Consumer):
    """faust's consumer, minus two ways it commits past a record that was never processed.

    faust 0.15.3 (`Consumer._new_offset`) counts a jump in the offsets it delivers as processed
    (meant for transaction markers and compacted topics; the topics the streams consume have
    neither), and compares the first processed offset with the committed one off by one (the
    committed offset is the next to read, so the record at it could be missing). Either way a
    record that faust dropped while fetching around a rebalance was committed as done and lost:
    a group then never completed (1 CI run of the random-SIGKILL test in about 10). Here a
    missing record holds the commit back and `StreamsRuntime.watchdog` re-reads it."""

    def _new_consumer_thread(self) -> Any:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def _new_offset(self, tp: Any) -> int | None:
        self._gap.pop(tp, None)  # a skipped offset is not a processed one
        acked = self._acked[tp]
        acked.sort()
        offset, n = next_commit(acked, self._committed_offset[tp])
        self._acked_index[tp].difference_update(acked[:n])
        del acked[:n]
        return offset

    def last_committed(self, tp: Any) -> int | None:
        """The offset this consumer last committed for `tp` (faust's own record of it, the private
        `_committed_offset`: faust 0.15.3 has no public read of it, and `StreamsRuntime.watchdog`
        needs it to find the records faust lost around a rebalance)."""
        return self._committed_offset.get(tp)

    def assume_committed(self, tp: Any, offset: int) -> None:
        """Count `offset` as committed for `tp` (in faust's private `_committed_offset`): the records
        below it are gone (deleted by retention), so `_new_offset` must not wait for them."""
        self._committed_offset[tp] = offset

    async def perform_seek(self) -> None:
        """After a rebalance: a partition without a committed offset starts at its earliest
        offset, which `_new_offset` then waits for (faust leaves it unknown)."""
        await super().perform_seek()
        unknown = [tp for tp in self.assignment() if self._committed_offset[tp] is None]
        if unknown:
            starts = await self.earliest_offsets(*unknown)
            for tp in unknown:
                if starts.get(tp) is not None:
                    self._committed_offset[tp] = starts[tp]


class _Transport(faust_aiokafka.Transport):
    Producer = _IdempotentProducer
    Consumer = _StrictConsumer


class AstraFaustApp(faust.App):
    """faust.App with an idempotent producer whose flush really flushes, and a consumer that commits
    only what was processed. faust 0.15.3 has no setting for its transport's Producer and Consumer
    classes: the private factories of the app's transports are the one place to put ours.

    `watch`, if set, runs every `watch_every_s` from the app's start: the app's own tasks and
    timers start only once its first table recovery is done (`App.on_started`), so a check of that
    recovery (streams/recovery_watch.py) cannot be one of them."""

    watch: Callable[[], None] | None = None
    watch_every_s = 1.0

    @Service.task
    async def _watch(self) -> None:
        while not self.should_stop:
            if self.watch is not None:
                self.watch()
            await self.sleep(self.watch_every_s)

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> Any:
        return _Transport(self.conf.broker_producer, self)


def is_stop_race(exc: BaseException) -> bool:
    """An error faust raises when a send meets a producer that its stop already stopped."""
    from faust.exceptions import NotReady

    return isinstance(exc, NotReady) or (isinstance(exc, RuntimeError) and "Producer not Running" in str(exc))


class QuietWorker(faust.Worker):
    """faust.Worker without its terminal spinner. faust-streaming 0.15.3 `Worker._setup_spinner_handler`
    sets the root logger to DEBUG whenever the spinner exists (it always does, on a terminal or
    not) and never sets it back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spinner = None
        self.crashed_while_stopping = False

    def _crash(self, reason: BaseException) -> None:
        # mode marks every node up to the worker as crashed when a child service crashes; mode
        # 0.7.1 keeps no record of whether that happened during the stop, which `_sentinel_task`
        # needs to tell the stop's own race from a crash
        self.crashed_while_stopping = self._stopped.is_set()
        super()._crash(reason)

    async def _sentinel_task(self) -> None:
        """mode's `Worker._shutdown_loop` runs this last, after the app has stopped, committed and
        flushed: mode sleeps 1 s in it, and every run's end waited that second for streams to exit.

        Then it re-raises the crash of any service, and the worker exits 1. A stop's own race is
        not a crash: faust's ProducerBuffer still sending while the stop has stopped the producer
        (NotReady, then "Cannot flush: Producer not Running"). Seen in CI after a broker of a
        cluster died mid-run: the run had reached its steps and exited 1 for streams' exit code.
        What the buffer held was not sent, so no offset after it was committed (the commit flushes
        first): a restart reads those records again, as after a SIGKILL."""
        if self.crash_reason is not None and self.crashed_while_stopping and is_stop_race(self.crash_reason):
            self.log.info("stopped while faust's producer buffer was still sending: %r", self.crash_reason)
            self.crash_reason = None

    @property
    def shortlabel(self) -> str:
        # the label of faust.Worker's log lines: "[^Worker]: Ready" is the line operators and
        # harnesses (tests/streams, bench/streams_pipeline.py) wait for
        return "Worker"


def make_table(app: Any, name: str, partitions: int, value_serializer: str, configs: dict[str, str]) -> Any:
    """A memory-store table whose changelog uses msgpack keys and the given value codec. Faust
    derives a table's codecs from key_type/value_type only (json otherwise, whatever the schema
    says) and builds its changelog topic in the constructor, so the codecs are set afterwards and
    the changelog topic rebuilt with them (faust 0.15.3; the crash tests cover the recovery)."""
    table = app.Table(name, partitions=partitions, extra_topic_configs=configs)
    table.key_serializer, table.value_serializer = "msgpack", value_serializer
    table.changelog_topic = table._new_changelog_topic()
    return table


class FaustTable:
    """A faust Table seen through the `streams.grouping.Table` protocol.

    Writes change the local store and send the changelog record through faust's ProducerBuffer
    (`send_changelog`), explicitly to the given partition. `written()` returns the delivery
    futures of the records sent since the last call, for the writes that must be durable before
    the next step (the emission intent). Every other write is made durable by the producer flush
    that precedes each offset commit (see `_IdempotentProducer.flush`)."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self._futures: list[Any] = []

    def get(self, key: str) -> Any:
        return self.table.data.get(key)

    def set(self, key: str, value: Any, partition: int) -> None:
        self.table.data[key] = value
        self._futures.append(self.table.send_changelog(partition, key, value))

    def delete(self, key: str, partition: int) -> None:
        self.table.data.pop(key, None)
        self._futures.append(self.table.send_changelog(partition, key, None, value_serializer="raw"))

    def set_local(self, key: str, value: Any) -> None:
        self.table.data[key] = value

    def delete_local(self, key: str) -> None:
        self.table.data.pop(key, None)

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(list(self.table.data.items()))

    def size(self) -> int:
        return len(self.table.data)

    def written(self) -> list[Any]:
        """Delivery futures of the changelog records sent since the last call."""
        out, self._futures = self._futures, []
        return out
