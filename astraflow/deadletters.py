"""`DeadLetters` and `decode_or_deadletter`: the one place where a record a component cannot use is
caught, and sent to `deadletter` with its source topic, partition, offset and reason."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, TypeVar, overload

from astraflow.kafka import Publisher, fetch_limit
from astraflow.records import DeadLetter, Record, RecordError, decode, encode
from astraflow.topics import DEADLETTER

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Record)
S = TypeVar("S", bound=Record)


class DeadLetters:
    """Publishes records a component could not use to `deadletter`, with their origin and reason."""

    TOPIC = DEADLETTER

    def __init__(self, publisher: Publisher, component: str) -> None:
        self.publisher = publisher
        self.component = component
        self.count = 0

    def publish(
        self,
        source_topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        raw: bytes,
        error: str,
        on_delivery: Callable[[Exception | None], None] | None = None,
    ) -> None:
        """Produce the dead letter; `on_delivery` hears the broker's answer (commit the source
        offset only after it acknowledged).

        A raw record or key longer than a dead letter can carry is cut, and `truncated` says so.
        Both crashed the component that was dead-lettering (found by tests/faults/test_fuzz.py): a
        key over MAX_KEY_BYTES made the DeadLetter invalid (RecordError), and a raw record that
        only fit its topic compressed (a trajectory of 20 MiB on a 16 MiB topic) made a dead letter
        larger than the producer's message.max.bytes (DeliveryError). The raw bytes are cut to
        what fits next to the rest of the dead letter and its Kafka key, which librdkafka counts too."""
        from astraflow.records.fields import MAX_BYTES, MAX_KEY_BYTES

        cut_key = key is not None and len(key) > MAX_KEY_BYTES
        key = key[:MAX_KEY_BYTES] if key is not None else None
        empty = DeadLetter(
            source_topic=source_topic,
            partition=partition,
            offset=offset,
            key=key,
            error=error[:8192],
            component=self.component,
        )
        # 64: the header `raw` adds to the encoding and librdkafka's per-message overhead (< 40 bytes)
        room = (
            min(fetch_limit(self.publisher.settings), MAX_BYTES) - len(encode(empty)) - len(key or b"") - 64
        )
        dead = dataclasses.replace(
            empty, raw=raw[:room], truncated=cut_key or len(raw) > room
        )  # checked again
        self.publisher.send(self.TOPIC, dead, key=key, on_delivery=on_delivery)
        self.count += 1
        log.warning("dead-lettered %s[%d]@%d: %s", source_topic, partition, offset, error)

    def publish_message(
        self, msg: Any, error: str, on_delivery: Callable[[Exception | None], None] | None = None
    ) -> None:
        self.publish(
            msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value() or b"", error, on_delivery
        )


@overload
def decode_or_deadletter(
    msg: Any,
    cls: type[R],
    dead: DeadLetters,
    known_policies: frozenset[str] | None = None,
    on_delivery: Callable[[Exception | None], None] | None = None,
) -> R | None: ...


@overload
def decode_or_deadletter(
    msg: Any,
    cls: tuple[type[R], type[S]],
    dead: DeadLetters,
    known_policies: frozenset[str] | None = None,
    on_delivery: Callable[[Exception | None], None] | None = None,
) -> R | S | None: ...


def decode_or_deadletter(
    msg: Any,
    cls: type[Record] | tuple[type[Record], type[Record]],
    dead: DeadLetters,
    known_policies: frozenset[str] | None = None,
    on_delivery: Callable[[Exception | None], None] | None = None,
) -> Record | None:
    """Decode a consumed message as `cls`; a bad one goes to `deadletter` and None is returned."""
    try:
        return decode(msg.value() or b"", cls, known_policies)
    except RecordError as exc:
        dead.publish_message(msg, str(exc), on_delivery)
        return None
