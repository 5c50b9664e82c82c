"""Weight following: a worker keeps each policy's engine on the newest published weights.

Reads the compacted `weights` topic from the beginning (no consumer group commits: every worker reads
all of it), so on start it picks up the latest version of each policy before taking tasks; afterwards
it applies each new version as it arrives. `astraflow.weights.fetch_weights` applies the delta chain
when the worker holds the base, else loads the full snapshot, verifying every file's sha256. A bad or
missing file is refused and reported (log, metric, dead letter of the event) while the engine keeps
the weights it has. Runs in its own thread; engine updates are handed to the worker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astraflow.config import KafkaSettings
from astraflow.errors import AstraFlowError
from astraflow.kafka import DeadLetters, consumer_config
from astraflow.records import RecordError, WeightVersion, decode
from astraflow.weights.auth import verify
from workers.engines.base import Engine

log = logging.getLogger(__name__)
TOPIC = "weights"


def high_watermarks(consumer: Any, topic: str, timeout: float = 30.0) -> dict[int, int]:
    """End offset of every partition of `topic`, retrying while a fresh topic has no leader yet."""
    from confluent_kafka import KafkaException, TopicPartition

    deadline = time.monotonic() + timeout
    while True:
        try:
            md = consumer.list_topics(topic, timeout=15)
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise AstraFlowError(f"topic {topic} does not exist (run `astraflow topics apply`)")
            return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
                    for p in sorted(meta.partitions)}
        except (KafkaException, AstraFlowError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class WeightFollower:
    def __init__(self, settings: KafkaSettings, engines: dict[str, Engine], loop: asyncio.AbstractEventLoop,
                 dead: DeadLetters, cache_dir: Path | None = None,
                 on_change: Callable[[str, int], None] | None = None) -> None:
        from confluent_kafka import Consumer

        self.settings = settings
        self.engines = engines
        self.loop = loop
        self.dead = dead
        self.cache_dir = cache_dir
        self.on_change = on_change
        self.held: dict[str, Any] = {}  # policy -> astraflow.weights.HeldWeights
        self.refused = 0
        self.applied = 0
        self.last_error: str | None = None
        conf = consumer_config(settings, f"weights-reader-{uuid.uuid4().hex[:8]}",
                               **{"enable.auto.commit": False, "auto.offset.reset": "earliest"})
        self.consumer = Consumer(conf)
        self.topic = settings.topic(TOPIC)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _assign(self) -> dict[int, int]:
        """Assign every partition from the beginning; returns the high watermarks."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        high = high_watermarks(self.consumer, self.topic)
        self.consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in high])
        return high

    def catch_up(self, timeout: float = 60.0) -> dict[str, WeightVersion]:
        """Read the topic to its end and apply the newest version of each policy (blocking; call it
        from a thread, not the event loop). Returns the events applied."""
        high = self._assign()
        latest: dict[str, WeightVersion] = {}
        done = {p for p, h in high.items() if h <= 0}
        deadline = time.monotonic() + timeout
        while len(done) < len(high) and time.monotonic() < deadline:
            msg = self.consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            event = self._decode(msg)
            if (event is not None and event.policy in self.engines
                    and event.version >= latest.get(event.policy, event).version):
                latest[event.policy] = event
            if msg.offset() + 1 >= high[msg.partition()]:
                done.add(msg.partition())
        if len(done) < len(high):
            raise AstraFlowError(f"could not read {self.topic} to its end within {timeout}s")
        for event in latest.values():
            self.apply(event)
        return latest

    def _decode(self, msg: Any) -> WeightVersion | None:
        try:
            return verify(decode(msg.value() or b"", WeightVersion))  # a forged event is dead-lettered
        except RecordError as exc:
            self.dead.publish_message(msg, str(exc))
            return None

    def apply(self, event: WeightVersion) -> bool:
        """Fetch and load one version; False (and the engine untouched) if it was refused."""
        from astraflow.weights import fetch_weights

        engine = self.engines.get(event.policy)
        if engine is None or event.version <= engine.version:
            return False
        try:
            held = fetch_weights(event, self.held.get(event.policy), self.cache_dir)
            future = asyncio.run_coroutine_threadsafe(engine.update_weights(held.state, held.version), self.loop)
            future.result(timeout=600)
        except (AstraFlowError, OSError, ValueError, RuntimeError) as exc:
            self.refused += 1
            self.last_error = f"{event.policy} v{event.version}: {exc}"
            log.error("refused weights of %s version %d, keeping version %d: %s", event.policy, event.version,
                      engine.version, exc)
            return False
        self.held[event.policy] = held
        self.applied += 1
        log.info("policy %s now at weight version %d", event.policy, held.version)
        if self.on_change is not None:
            self.on_change(event.policy, held.version)
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._follow, name="weight-follower", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            msg = self.consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            event = self._decode(msg)
            if event is not None:
                self.apply(event)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.consumer.close()
