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
import concurrent.futures
import logging
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astraflow.config import KafkaSettings
from astraflow.deadletters import DeadLetters
from astraflow.errors import AstraFlowError
from astraflow.kafka import TopicReader
from astraflow.records import RecordError, WeightVersion, decode
from astraflow.topics import WEIGHTS
from astraflow.weights.auth import verify
from workers.engines.base import InferenceEngine

log = logging.getLogger(__name__)
TOPIC = WEIGHTS


class WeightFollower:
    def __init__(
        self,
        settings: KafkaSettings,
        engines: dict[str, InferenceEngine],
        loop: asyncio.AbstractEventLoop,
        dead: DeadLetters,
        cache_dir: Path | None = None,
        on_change: Callable[[str, int], None] | None = None,
    ) -> None:
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
        self.reader = TopicReader(
            settings, [TOPIC], group=f"weights-reader-{uuid.uuid4().hex[:8]}", **{"enable.auto.commit": False}
        )
        self.topic = settings.topic(TOPIC)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def catch_up(self, timeout: float = 60.0) -> dict[str, WeightVersion]:
        """Read the topic to its end and apply the newest version of each policy (blocking; call it
        from a thread, not the event loop). Returns the events applied."""
        self.reader.assign_from_beginning([self.topic])
        latest: dict[str, WeightVersion] = {}
        for msg in self.reader.to_end(timeout):
            event = self._decode(msg)
            if (
                event is not None
                and event.policy in self.engines
                and event.version >= latest.get(event.policy, event).version
            ):
                latest[event.policy] = event
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
            future = asyncio.run_coroutine_threadsafe(
                engine.update_weights(held.state, held.version), self.loop
            )
            future.result(timeout=600)
        except concurrent.futures.CancelledError:  # the worker's loop ended under it: stopping
            log.info(
                "weights of %s version %d not applied: the worker is stopping", event.policy, event.version
            )
            return False
        except (AstraFlowError, OSError, ValueError, RuntimeError) as exc:
            self.refused += 1
            self.last_error = f"{event.policy} v{event.version}: {exc}"
            log.error(
                "refused weights of %s version %d, keeping version %d: %s",
                event.policy,
                event.version,
                engine.version,
                exc,
            )
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
            msg = self.reader.poll(0.5)
            if msg is None:
                continue
            event = self._decode(msg)
            if event is not None:
                self.apply(event)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.reader.close()
