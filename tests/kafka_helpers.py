"""Helpers shared by the broker tests: read a topic back, look up or commit a group's offsets, wait
for a condition, and the settings of a secured broker's principals. The readers are astraflow.kafka's
TopicReader, as in the components."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astraflow.broker import launcher, secure
from astraflow.config import KafkaSettings
from astraflow.kafka import TopicReader, make_consumer
from astraflow.records import decode, trajectories_of


def read_messages(
    settings: KafkaSettings,
    topic: str,
    *,
    until: Callable[[list[Any]], bool] | None = None,
    timeout: float = 30.0,
    settle: float = 2.0,
) -> list[Any]:
    """The messages of the base topic `topic` from the beginning (every partition): read until
    `until(messages)` holds (or `timeout`), then until `settle` seconds pass with nothing new, so
    extra records (duplicates) are seen too."""
    out: list[Any] = []
    deadline = quiet_since = time.monotonic()
    deadline += timeout
    with TopicReader(settings, [topic], from_beginning=True) as reader:
        while True:
            msg = reader.poll(0.2)
            now = time.monotonic()
            if msg is not None:
                out.append(msg)
                quiet_since = now
            if ((until is None or until(out)) and now - quiet_since >= settle) or now > deadline:
                return out


def read_topic(
    settings: KafkaSettings,
    topic: str,
    cls: type | None = None,
    *,
    until: Callable[[list[Any]], bool] | None = None,
    timeout: float = 30.0,
    settle: float | None = None,
) -> list[Any]:
    """`read_messages` decoded (as `cls` if given; `until` sees the records). Without `until` it
    stops once the topic was quiet for 2 s; with it, as soon as it holds, unless `settle` says."""
    records: list[Any] = []

    def holds(msgs: list[Any]) -> bool:
        records.extend(decode(m.value(), cls) for m in msgs[len(records) :])
        return until is None or until(records)

    msgs = read_messages(
        settings,
        topic,
        until=holds,
        timeout=timeout,
        settle=settle if settle is not None else (2.0 if until is None else 0.0),
    )
    holds(msgs)
    return records


def read_trajectories(
    settings: KafkaSettings, *, until: Callable[[list[Any]], bool] | None = None, timeout: float = 30.0
) -> list[Any]:
    """The Trajectories on `trajectories`, a batch's opened (a worker sends a group's as one record);
    `until` sees the trajectories."""

    def flat(records: list[Any]) -> list[Any]:
        return [t for r in records for t in trajectories_of(r)]

    return flat(
        read_topic(
            settings, "trajectories", until=(lambda rs: until(flat(rs))) if until else None, timeout=timeout
        )
    )


def read_now(
    settings: KafkaSettings, topic: str, cls: type | None = None, timeout: float = 60.0
) -> list[Any]:
    """The records of `topic` up to its end offsets at the call (decoded, as `cls` if given)."""
    with TopicReader(settings, [topic], from_beginning=True) as reader:
        return [decode(m.value(), cls) for m in reader.to_end(timeout)]


def committed(settings: KafkaSettings, group: str, topic: str) -> dict[int, int]:
    """Committed offsets of the base consumer group `group` on `topic`, per partition."""
    return {tp.partition: tp.offset for tp in _committed(settings, group, topic)}


def committed_tokens(settings: KafkaSettings, group: str, topic: str) -> dict[int, str]:
    """The metadata of the commits of `group` on `topic` that carry one, per partition."""
    return {tp.partition: tp.metadata for tp in _committed(settings, group, topic) if tp.metadata}


def _committed(settings: KafkaSettings, group: str, topic: str) -> list[Any]:
    from confluent_kafka import TopicPartition

    name = settings.topic(topic)
    with TopicReader(settings, group=group, **{"enable.auto.commit": False}) as reader:
        parts = [TopicPartition(name, p) for p in reader.end_offsets(name)]
        return list(reader.consumer.committed(parts, timeout=15))


def end_offsets(settings: KafkaSettings, topic: str) -> dict[int, int]:
    with TopicReader(settings) as reader:
        return reader.end_offsets(settings.topic(topic))


def commit(
    settings: KafkaSettings,
    group: str,
    topic: str,
    offsets: dict[int, int],
    tokens: dict[int, str] | None = None,
) -> None:
    """Commit `offsets` for the base group `group` from a consumer that never joins it, as the
    collector's probes read them; `tokens`: the metadata of some of the commits (a worker's token)."""
    from confluent_kafka import TopicPartition

    consumer = make_consumer(settings, group, **{"enable.auto.commit": False})
    name, tokens = settings.topic(topic), tokens or {}
    try:
        consumer.commit(
            offsets=[
                TopicPartition(name, p, o, metadata=tokens[p]) if p in tokens else TopicPartition(name, p, o)
                for p, o in offsets.items()
            ],
            asynchronous=False,
        )
    finally:
        consumer.close()


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 1.0,
    proc: subprocess.Popen[Any] | None = None,
) -> None:
    """Return once `predicate()` is true; fail after `timeout`, or as soon as `proc` has exited."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def settings_of(state: launcher.BrokerState, kind: str, namespace: str | None = None) -> KafkaSettings:
    """The settings of a `kind` component's principal on a secured broker (`broker start --secure`)."""
    env = secure.credentials(Path(state.data_dir), kind).env(state.bootstrap)
    if namespace:
        env["ASTRAFLOW_NAMESPACE"] = namespace
    return KafkaSettings.from_env(environ=env)
