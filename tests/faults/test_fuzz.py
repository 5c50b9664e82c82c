"""10,000 fuzzed records into a running `astraflow run` (issue 11): the input topics of its worker
(`tasks`), its streams worker (`trajectories`) and its trainer (`samples.<policy>`) get random
bytes, empty values, truncated encodings, records of the wrong type, valid records with one field
broken (wrong type, missing, out of range, NaN or inf, unknown policy, negative or huge lengths,
token arrays of mismatched lengths, array headers that lie), records that decode but that the
consumer's later checks refuse (a task for an unknown environment or a group larger than the worker
takes, a trajectory whose group_id is not its task's or whose key is not its group_id, a sample of
a policy the run does not train), keys longer than a dead letter keeps, records without a key or
with Kafka headers, and records near their topic's size limit (incompressible ones just under it,
compressible ones over it that the broker takes compressed).

Each record is invalid for its consumer by construction: the consumer's own check (the codec's
`decode` and, for the worker, `workers.episodes.refusal`; for streams its `validate` stage) refuses
it before it is sent, and the reason it gives is what the dead letter must carry. The run must not
crash or restart any component, its trainer must keep taking steps, and `deadletter` must hold every
fuzzed record exactly once, from the component that consumes its topic, with the topic, partition
and offset it was produced at.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from astraflow.config import KafkaSettings, load_recipe
from astraflow.kafka import TopicReader, make_producer
from astraflow.records import (
    DeadLetter,
    decode,
)
from astraflow.records.fields import MAX_KEY_BYTES
from astraflow.topics import DEADLETTER
from tests.e2e.helpers import run_env, summary, trainer_steps
from tests.faults.fuzzing import POLICY, TOTAL, Fuzzed, Fuzzer, fuzz
from tests.faults.harness import (
    RUN_MARKS,
    component_pids,
    fault_recipe,
    finish,
    settings_of,
    start_run,
    stop,
    wait_steps,
)

pytestmark = RUN_MARKS  # a loaded 2-core machine: the first step can take minutes

#: The supervisor's words for a component that exited on its own (astraflow/runner/supervisor.py).
CRASH_EVENTS = re.compile(r"crashed with status|failed with status|restarted ")


# ------------------------------------------------------------------------------ producing, reading


def produce(settings: KafkaSettings, records: list[Fuzzed]) -> dict[tuple[str, int, int], Fuzzed]:
    """Produce every record (with its key, if any, and its headers) with one producer; the records
    by the (full topic, partition, offset) they got. Its message.max.bytes is raised so the
    compressible records over a topic's limit leave the client: the broker judges them by their
    compressed batch."""
    delivered: dict[tuple[str, int, int], Fuzzed] = {}
    errors: list[str] = []

    def done(f: Fuzzed) -> Any:
        def report(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(f"{msg.topic()}: {err}")
            else:
                delivered[(msg.topic(), msg.partition(), msg.offset())] = f

        return report

    producer = make_producer(settings, **{"message.max.bytes": 64 << 20})
    for f in records:
        while True:
            try:
                producer.produce(
                    settings.topic(f.consumer.topic),
                    value=f.value,
                    key=f.key,
                    headers=f.headers,
                    on_delivery=done(f),
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(180) == 0, "fuzzed records still unacknowledged after 180 s"
    assert not errors, errors[:5]
    assert len(delivered) == len(records)
    return delivered


def read_dead_letters(
    settings: KafkaSettings,
    delivered: dict[tuple[str, int, int], Fuzzed],
    proc: Any,
    run_dir: Path,
    timeout: float,
) -> dict[int, list[DeadLetter]]:
    """The dead letters of the fuzzed records (by record number; a dead letter names the topic,
    partition and offset it came from, which tell keyless records apart too), read from the
    beginning of `deadletter` until each record has one, then 5 s more so duplicates show too.
    Fails as soon as a component crashed, with the supervisor's event."""
    found: dict[int, list[DeadLetter]] = {}
    deadline = time.monotonic() + timeout
    complete_at: float | None = None
    last_check = 0.0
    with TopicReader(settings, [DEADLETTER], from_beginning=True) as reader:
        while complete_at is None or time.monotonic() - complete_at < 5:
            for msg in reader.poll_batch(0.5):
                dead = decode(msg.value(), DeadLetter)
                f = delivered.get((dead.source_topic, dead.partition, dead.offset))
                if f is not None:
                    found.setdefault(f.n, []).append(dead)
            if complete_at is None and len(found) == len(delivered):
                complete_at = time.monotonic()
            if time.monotonic() - last_check > 5:
                last_check = time.monotonic()
                assert not crashes(run_dir), crashes(run_dir)[:6000]
                assert proc.poll() is None, f"the run exited ({proc.returncode}):\n{finish(proc, 10)[-4000:]}"
            if complete_at is None and time.monotonic() > deadline:
                missing = sorted(f.n for f in delivered.values() if f.n not in found)
                raise AssertionError(
                    f"{len(missing)} of {len(delivered)} fuzzed records not dead-lettered in "
                    f"{timeout:.0f}s, e.g. {missing[:10]}"
                )
    return found


def crashes(run_dir: Path) -> str:
    """The supervisor's events from its first crash or restart of a component on ("" if none):
    each carries the tail of the component's log, which says why."""
    path = run_dir / "events.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    found = CRASH_EVENTS.search(text)
    return text[text.rfind("\n", 0, found.start()) + 1 :] if found else ""


def problems(delivered: dict[tuple[str, int, int], Fuzzed], found: dict[int, list[DeadLetter]]) -> list[str]:
    """What is wrong with the dead letters of the `delivered` records; empty when each is right."""
    out = []
    for position, f in delivered.items():
        letters = found.get(f.n, [])
        where = f"fuzz-{f.n:05d} ({f.consumer.component}, {f.kind}{'' if f.key else ', keyless'})"
        if len(letters) != 1:
            out.append(f"{where}: {len(letters)} dead letters")
            continue
        dead = letters[0]
        raw = f.value or b""
        if (dead.source_topic, dead.partition, dead.offset) != position:  # by construction; kept as a guard
            out.append(
                f"{where}: from {dead.source_topic}[{dead.partition}]@{dead.offset}, produced at {position}"
            )
        if dead.component != f.consumer.component:
            out.append(f"{where}: dead-lettered by {dead.component}")
        if dead.error != f.reason[:8192]:  # what a dead letter's error holds (records/types.py)
            out.append(f"{where}: reason {dead.error[:300]!r}, the consumer's check says {f.reason[:300]!r}")
        key = f.key[:MAX_KEY_BYTES] if f.key is not None else None
        if dead.key != key or not raw.startswith(dead.raw):
            out.append(f"{where}: key or raw bytes are not the record's")
        if dead.truncated != (len(f.key or b"") > MAX_KEY_BYTES or len(dead.raw) < len(raw)):
            out.append(
                f"{where}: truncated={dead.truncated} but {len(dead.raw)} of {len(raw)} raw bytes kept"
            )
    return out


# ------------------------------------------------------------------------------ the test


def test_ten_thousand_fuzzed_records_are_dead_lettered_and_crash_nothing(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    recipe = fault_recipe(tmp_path / "arithmetic.yaml")
    run_dir = tmp_path / "run"
    env = run_env(kafka_bootstrap)
    settings = settings_of(run_dir, env)
    records = fuzz(settings, load_recipe(recipe))
    assert len(records) == TOTAL and len({f.n for f in records}) == TOTAL
    kinds = {f.kind for f in records}
    assert kinds == {*Fuzzer.KINDS, "near_limit", "compressible", "long_key"}, kinds
    assert (
        200 < sum(f.key is None for f in records) < 400 and 800 < sum(bool(f.headers) for f in records) < 1200
    )

    proc = start_run(recipe, run_dir, env)
    try:
        wait_steps(run_dir, POLICY, 1, proc, 900)
        pids = {kind: component_pids(run_dir, kind) for kind in ("worker", "streams", "trainer")}
        assert all(pids.values()), pids
        t0 = time.monotonic()
        delivered = produce(settings, records)
        found = read_dead_letters(settings, delivered, proc, run_dir, 600)
        dead_lettered_s = time.monotonic() - t0
        wait_steps(run_dir, POLICY, trainer_steps(run_dir, POLICY) + 2, proc, 600)  # the pipeline kept going
        assert not crashes(run_dir), crashes(run_dir)[:6000]
        assert {kind: component_pids(run_dir, kind) for kind in pids} == pids, "a component was replaced"
    finally:
        out = stop(proc, 300)
    assert proc.returncode == 0, out[-3000:]
    assert summary(run_dir)["restarts"] == {}, summary(run_dir)["restarts"]
    wrong = problems(delivered, found)
    assert not wrong, f"{len(wrong)} fuzzed records not dead-lettered right:\n" + "\n".join(wrong[:20])
    print(f"{TOTAL} fuzzed records dead-lettered in {dead_lettered_s:.0f} s")
