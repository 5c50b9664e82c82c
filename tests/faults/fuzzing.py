"""The fuzzed records of tests/faults/test_fuzz.py: for each consumer (worker, streams, trainer),
records that its own check refuses, built from valid records by one mutation each, with the reason
the check gives (what the dead letter must say)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

from astraflow.config import KafkaSettings, Recipe
from astraflow.records import (
    SCHEMA_VERSION,
    Record,
    RecordError,
    Sample,
    SampleBatch,
    Task,
    Trajectory,
    TrajectoryBatch,
    decode,
    encode,
)
from astraflow.records.fields import MAX_KEY_BYTES, MAX_TEXT_CHARS
from astraflow.topics import TASKS, TRAJECTORIES, expand, load_spec, samples
from streams.validate import Validate
from tests.faults.mutations import (
    DROP,
    OTHER_TYPES,
    POLICIES,
    POLICY,
    TARGETED,
    WRONG_VALUES,
    Several,
    body_of,
    lying,
    pack,
    packed,
    valid_record,
)
from workers.episodes import Runtime, refusal

TOTAL = 10_000


# ------------------------------------------------------------------------------ the consumers


@dataclass(frozen=True)
class Consumer:
    """A component, the topic it reads, and its own check of what it reads: the reason it
    refuses a value, or None when it would take it."""

    component: str
    topic: str
    record: type[Record]
    refuse: Callable[[bytes | None, bytes | None], str | None]


def decoder(
    cls: type[Record] | tuple[type[Record], ...],
) -> Callable[[bytes | None, bytes | None], str | None]:
    """What the trainer does (decode_or_deadletter: a null value decodes as b"")."""

    def refuse(value: bytes | None, _key: bytes | None) -> str | None:
        try:
            decode(value or b"", cls, POLICIES)
        except RecordError as exc:
            return str(exc)
        return None

    return refuse


def worker_check(recipe: Recipe) -> Callable[[bytes | None, bytes | None], str | None]:
    """What the worker does: decode, then its own checks of a task that decoded
    (workers.episodes.refusal: the group size, the environment and its workflow)."""
    runtime = Runtime(recipe, codec=None)  # type: ignore[arg-type]  # resolving a task needs no tokenizer

    def refuse(value: bytes | None, key: bytes | None) -> str | None:
        reason = decoder(Task)(value, key)
        if reason is not None:
            return reason
        return refusal(decode(value or b"", Task, POLICIES), runtime, recipe.worker.max_group_size)

    return refuse


def streams_validate(value: bytes | None, key: bytes | None) -> str | None:
    """What streams does: its validate stage (the recipe's, with its defaults) on value and key.
    The fuzzed keys are never a group_id, so it refuses every record whole (a batch too), a valid one
    for its key."""
    try:
        Validate().split(value, key, POLICIES)
    except RecordError as exc:
        return str(exc)
    return None


def consumers(recipe: Recipe) -> tuple[Consumer, ...]:
    return (
        Consumer("worker", TASKS, Task, worker_check(recipe)),
        Consumer("streams", TRAJECTORIES, Trajectory, streams_validate),
        Consumer("trainer", samples(POLICY), Sample, decoder((Sample, SampleBatch))),  # streams sends batches
    )


@dataclass
class Fuzzed:
    n: int  # its number: b"fuzz-<n>" is its key, unless keyless
    key: bytes | None
    consumer: Consumer
    kind: str
    value: bytes | None
    reason: str  # the consumer's reason to refuse it: its dead letter must say this
    headers: list[tuple[str, bytes]] | None = None


class Fuzzer:
    """Fuzzed values for one consumer, from a seeded RNG; each is refused by the consumer's own
    check (a mutation that happens to stay valid is drawn again)."""

    KINDS = {
        "noise": 15,
        "empty": 5,
        "truncated": 15,
        "wrong_type": 10,
        "targeted": 30,
        "generic": 20,
        "rejected": 5,
    }
    KEYLESS, HEADERS = 0.03, 0.1  # shares of records without a key, and with Kafka headers

    def __init__(self, consumer: Consumer, rng: random.Random, max_message_bytes: int) -> None:
        self.consumer, self.rng, self.limit = consumer, rng, max_message_bytes

    def record(self, n: int, kind: str | None = None, long_key: bool = False) -> Fuzzed:
        """Fuzzed record number `n` of `kind` (else one drawn by KINDS' weights); its key is
        b"fuzz-<n>", padded past MAX_KEY_BYTES with `long_key`, or (a share KEYLESS) none; a share
        HEADERS carries random Kafka headers, which no consumer reads."""
        kind = kind or self.rng.choices(list(self.KINDS), weights=list(self.KINDS.values()))[0]
        key: bytes | None = b"fuzz-%05d" % n + (b"~" * (MAX_KEY_BYTES + 4464) if long_key else b"")
        if not long_key and self.rng.random() < self.KEYLESS:
            key = None
        headers = None
        if self.rng.random() < self.HEADERS:
            headers = [
                (self.rng.choice(["h", "", "ünï", "x" * 200]), self.rng.randbytes(self.rng.randrange(64)))
                for _ in range(self.rng.randint(1, 4))
            ]
        for _ in range(100):
            value, must_name = getattr(self, kind)()
            reason = self.consumer.refuse(value, key)
            if reason is None:
                continue  # stayed valid: draw again
            assert reason, f"{kind}: an empty reason"
            assert must_name in reason, f"{self.consumer.component} {kind}: {must_name!r} not in {reason!r}"
            return Fuzzed(n, key, self.consumer, "long_key" if long_key else kind, value, reason, headers)
        raise AssertionError(f"{kind} mutations of {self.consumer.record.TYPE} stayed valid 100 times")

    def base(self) -> Record:
        return valid_record(self.consumer.record, self.rng)

    def noise(self) -> tuple[bytes, str]:
        return self.rng.randbytes(self.rng.randint(1, 512)), ""

    def empty(self) -> tuple[bytes | None, str]:
        return self.rng.choice([None, b""]), "<bytes>"

    def truncated(self) -> tuple[bytes, str]:
        data = encode(self.base())
        return data[: self.rng.randrange(1, len(data))], "<bytes>"

    def wrong_type(self) -> tuple[bytes, str]:
        cls = self.rng.choice([c for c in OTHER_TYPES if c is not self.consumer.record])
        other = encode(valid_record(cls, self.rng))
        return other, f"record, got {cls.TYPE}"

    def targeted(self) -> tuple[bytes, str]:
        record = self.base()
        field, value, names = self.rng.choice(TARGETED[self.consumer.record])
        body = body_of(record)
        n = len(getattr(record, "tokens", ())) or 1
        new = value(n)
        if new is DROP:
            del body[field]
        elif isinstance(new, Several):
            body.update(new)
        else:
            body[field] = new
        return pack(body), names

    def generic(self) -> tuple[bytes, str]:
        body = body_of(self.base())
        op = self.rng.randrange(5)
        if op == 0:  # a field of the wrong type or out of range
            body[self.rng.choice(list(body))] = self.rng.choice(WRONG_VALUES)
        elif op == 1:  # a field missing (an optional one leaves it valid: drawn again)
            del body[self.rng.choice(list(body))]
        elif op == 2:  # a field no record has
            name = self.rng.choice(["surprise", "TYPE", "__class__", "validate"])
            body[name] = self.rng.choice([None, 1, "x", {}])
            return pack(body), "unknown field"
        elif op == 3:  # the schema version; a packed array here crashed every consumer (records/codec.py)
            body["v"] = self.rng.choice(
                [SCHEMA_VERSION + 1, str(SCHEMA_VERSION), 1.0, True, packed([1, 1], "int32")]
            )
            return pack(body), "schema version"
        else:
            body["t"] = self.rng.choice(["Pickle", None, 1, ["Task"], packed([1], "uint8")])
            return pack(body), "unknown record type"
        return pack(body), ""

    def rejected(self) -> tuple[bytes, str]:
        """A record the codec decodes that its consumer's later checks refuse: a task for an
        environment this worker does not know or a group larger than it takes, a trajectory whose
        group_id is not its task's (or whose Kafka key is not its group_id), a sample of a policy
        this run does not train."""
        record = self.base()
        if isinstance(record, Task):
            if self.rng.random() < 0.5:
                return encode(dataclasses.replace(record, env="nosuchenv")), "nosuchenv"
            return encode(dataclasses.replace(record, group_size=4096)), "exceeds worker.max_group_size"
        if isinstance(record, Trajectory):
            draw = self.rng.random()
            if draw < 0.4:
                return encode(dataclasses.replace(record, group_id=record.group_id + "x")), "group_id"
            if draw < 0.7:  # a worker's batch of the group, under another key: refused whole
                return encode(
                    TrajectoryBatch(group_id=record.group_id, items=[encode(record)])
                ), "TrajectoryBatch.<key>"
            return encode(record), "<key>"
        assert isinstance(record, Sample)
        body = body_of(record)
        body["policy"] = "verifier"  # a valid name, not a policy of this run: the codec checks it last
        return pack(body), "unknown policy 'verifier'"

    def near_limit(self) -> tuple[bytes, str]:
        """Incompressible noise just under the topic's limit (lz4 adds a little to it)."""
        return self.rng.randbytes(self.limit * 9 // 10), ""

    def compressible(self) -> tuple[bytes, str]:
        """A record larger than the topic's limit that the broker takes lz4-compressed: zeros in an
        array over MAX_TOKENS, or a Task payload over MAX_TEXT_CHARS."""
        body = body_of(self.base())
        if self.consumer.record is Task:
            body["payload"] = {"pad": "0" * max(self.limit + (self.limit >> 2), MAX_TEXT_CHARS + 1)}
            return pack(body), "payload.pad"
        count = (self.limit + (self.limit >> 2)) // 4
        body["tokens"] = lying("int32", count, 4 * count)
        return pack(body), "exceeds"


def fuzz(settings: KafkaSettings, recipe: Recipe, seed: int = 11) -> list[Fuzzed]:
    """TOTAL fuzzed records split over the three consumers of `recipe`'s run, in a seeded random order."""
    rng = random.Random(seed)
    readers = consumers(recipe)
    limits = {t.name: int(t.configs["max.message.bytes"]) for t in expand(load_spec(), [POLICY], settings)}
    out: list[Fuzzed] = []
    for i, consumer in enumerate(readers):
        fuzzer = Fuzzer(consumer, rng, limits[settings.topic(consumer.topic)])
        share = TOTAL // len(readers) + (1 if i < TOTAL % len(readers) else 0)
        special = ["near_limit", "near_limit", "compressible"] + ["long_key"] * 10
        for j in range(share):
            n = len(out)
            kind = special[j] if j < len(special) else None
            if kind == "long_key":  # a random kind with a key longer than a dead letter keeps
                out.append(fuzzer.record(n, long_key=True))
            else:
                out.append(fuzzer.record(n, kind))
    rng.shuffle(out)
    return out
