"""Wire records: round trips of every record, strict validation, and a fuzz of every decoder."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astraflow.records import (
    RECORD_TYPES,
    SCHEMA_VERSION,
    Demonstration,
    Record,
    RecordError,
    Sample,
    Task,
    Trajectory,
    decode,
    encode,
)
from astraflow.records.fields import Array
from tests.faults.mutations import WRONG_VALUES, packed
from tests.foundation.strategies import ALL, make_traj, seed_records


@pytest.mark.parametrize("name", sorted(ALL))
def test_round_trip_every_record(name: str) -> None:
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ALL[name])
    def check(record: Record) -> None:
        data = encode(record)
        back = decode(data, type(record))
        assert back == record
        assert decode(data) == record  # untyped decode finds the type from the tag
        assert encode(back) == data  # canonical: re-encoding gives the same bytes

    check()


def test_token_arrays_travel_as_packed_buffers() -> None:
    traj = make_traj(tokens=list(range(1024)), owner=[0] * 1024, logprobs=[-0.1] * 1024, versions=[1] * 1024)
    data = encode(traj)
    body = msgpack.unpackb(data, raw=False)
    assert isinstance(body["tokens"], msgpack.ExtType)
    # 1024 int32 + 1024 int8 + 1024 float32 + 1024 int32 plus headers: no per-element overhead
    assert 13 * 1024 < len(data) < 13 * 1024 + 600
    back = decode(data, Trajectory)
    assert back.tokens.dtype == np.int32 and back.logprobs.dtype == np.float32 and back.owner.dtype == np.int8


@pytest.mark.parametrize(
    ("over", "field", "words"),
    [
        ({"tokens": [1, 2, 3]}, "owner", "3"),
        ({"rewards": {"solver": float("nan")}}, "rewards.solver", "finite"),
        ({"rewards": {"solver": float("inf")}}, "rewards.solver", "finite"),
        ({"rewards": {"other": 1.0}}, "rewards", "one reward per policy"),
        ({"logprobs": [0.0, 0.0, float("nan"), -1.0]}, "logprobs", "finite"),
        ({"logprobs": [0.0, 0.0, 0.5, -1.0]}, "logprobs", "maximum"),
        ({"owner": [-1, -1, 0, 1]}, "owner", "only 1 policies"),
        ({"versions": [-1, -1, -1, 4]}, "versions", "weight version"),
        ({"tokens": [1.5, 2, 3, 4]}, "tokens", "int32"),
        ({"tokens": [-1, 2, 3, 4]}, "tokens", "minimum"),
        ({"env": "no spaces allowed"}, "env", "does not match"),
        ({"policies": ["a", "a"]}, "policies", "unique"),
        ({"finish_reason": "exploded"}, "finish_reason", "not one of"),
        ({"sample_index": 4}, "sample_index", "group_size"),
        ({"group_size": "8"}, "group_size", "integer"),
        ({"task_id": ""}, "task_id", "empty"),
    ],
)
def test_invalid_trajectory_names_the_field(over: dict, field: str, words: str) -> None:
    with pytest.raises(RecordError) as info:
        encode(make_traj(**over))
    assert info.value.field == field
    assert words in str(info.value)
    assert str(info.value).startswith(f"Trajectory.{field}")


def test_known_policies_are_enforced() -> None:
    data = encode(make_traj())
    assert decode(data, Trajectory, known_policies=frozenset({"solver"})).policies == ["solver"]
    with pytest.raises(RecordError, match="unknown policy 'solver'") as info:
        decode(data, Trajectory, known_policies=frozenset({"verifier"}))
    assert info.value.field == "policies[0]"
    task = Task(task_id="t", env="arithmetic", roles={"agent": "ghost"})
    with pytest.raises(RecordError, match="unknown policy 'ghost'"):
        encode(task, known_policies=frozenset({"solver"}))


def test_a_demonstration_is_one_of_its_set_with_a_mask_per_token() -> None:
    def demo(**over: object) -> Demonstration:
        base: dict = dict(
            policy="p",
            source="s",
            index=0,
            count=2,
            tokens=np.arange(3, dtype=np.int32),
            loss_mask=np.array([0, 1, 1], np.uint8),
        )
        return Demonstration(**{**base, **over})

    assert decode(encode(demo()), Demonstration).loss_mask.tolist() == [0, 1, 1]
    with pytest.raises(RecordError, match="2 is not below count 2") as info:
        demo(index=2)
    assert info.value.field == "index"
    with pytest.raises(RecordError, match="2 entries for 3 tokens"):
        demo(loss_mask=np.array([0, 1], np.uint8))


def test_encode_checks_a_record_again_once_a_field_is_assigned() -> None:
    traj = make_traj()
    assert traj.unchanged()  # built valid: encoding need not check it again
    first = encode(traj)
    traj.rewards = {"solver": float("nan")}
    assert not traj.unchanged()
    with pytest.raises(RecordError, match="rewards.solver: must be finite"):
        encode(traj)
    traj.rewards = {"solver": 1.0}
    traj.tokens = traj.tokens.tolist()  # normalised back into an int32 array by the new check
    assert encode(traj) == first
    assert isinstance(traj.tokens, np.ndarray) and traj.unchanged()


def hand_made(**fields: object) -> bytes:
    body = {"v": SCHEMA_VERSION, "t": "Trajectory"}
    body.update(fields)
    return msgpack.packb(body, use_bin_type=True)


def test_hand_written_records_with_wrong_types_are_refused() -> None:
    good = msgpack.unpackb(encode(make_traj()), raw=False)
    good.pop("v"), good.pop("t")
    with pytest.raises(RecordError) as info:
        decode(hand_made(**{**good, "tokens": [1, 2, 3, 4]}), Trajectory)
    assert info.value.field == "tokens"
    assert "packed int32 array" in str(info.value)


def test_decoder_rejects_wrong_types_missing_fields_versions_and_tags() -> None:
    good = msgpack.unpackb(encode(make_traj()), raw=False)
    good.pop("v"), good.pop("t")
    cases = [
        (hand_made(**{**good, "rewards": "lots"}), "rewards", "expected a map"),
        (hand_made(**{**good, "group_size": 2.5}), "group_size", "expected an integer"),
        (hand_made(**{k: v for k, v in good.items() if k != "task_id"}), "task_id", "missing"),
        (hand_made(**{**good, "surprise": 1}), "surprise", "unknown field"),
        (msgpack.packb({**good, "v": 99, "t": "Trajectory"}), "v", "schema version"),
        (msgpack.packb({**good, "v": SCHEMA_VERSION, "t": "Pickle"}), "t", "unknown record type"),
        (msgpack.packb([1, 2, 3]), "<bytes>", "map"),
        (b"\xc1", "<bytes>", "msgpack"),
        (b"", "<bytes>", "msgpack"),
    ]
    for data, field, words in cases:
        with pytest.raises(RecordError) as info:
            decode(data, Trajectory)
        assert info.value.field == field, (field, str(info.value))
        assert words in str(info.value)


def test_array_extension_is_checked() -> None:
    good = msgpack.unpackb(encode(make_traj()), raw=False)
    good.pop("v"), good.pop("t")
    bad_len = msgpack.ExtType(1, bytes([3]) + (10).to_bytes(4, "little") + b"\x00" * 8)
    bad_code = msgpack.ExtType(1, bytes([99]) + (1).to_bytes(4, "little") + b"\x00")
    other_ext = msgpack.ExtType(7, b"x")
    for ext, words in [(bad_len, "carries"), (bad_code, "dtype code"), (other_ext, "extension type")]:
        with pytest.raises(RecordError, match=words):
            decode(hand_made(**{**good, "tokens": ext}), Trajectory)


def test_records_do_not_decode_as_other_types() -> None:
    sample = Sample(policy="solver", traj_id="a", group_id="g", task_id="t", env="e")
    with pytest.raises(RecordError, match="expected a Trajectory record, got Sample"):
        decode(encode(sample), Trajectory)


# ----------------------------------------------------------------------------------------- fuzz

FUZZ_CASES = 12_000


def _mutations(rng: random.Random, seeds: list[bytes], n: int) -> list[bytes]:
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:  # pure noise
            out.append(rng.randbytes(rng.randint(0, 256)))
        else:
            data = bytearray(rng.choice(seeds))
            for _ in range(rng.randint(1, 8)):
                if not data:
                    break
                op = rng.randint(0, 3)
                pos = rng.randrange(len(data))
                if op == 0:
                    data[pos] = rng.randrange(256)  # flip a byte
                elif op == 1:
                    del data[pos : pos + rng.randint(1, 16)]  # truncate a span
                elif op == 2:
                    data[pos:pos] = rng.randbytes(rng.randint(1, 16))  # insert noise
                else:
                    data[pos] ^= 1 << rng.randrange(8)  # flip a bit
            out.append(bytes(data))
    return out


@pytest.mark.timeout(300)
def test_fuzz_every_decoder_raises_only_record_error() -> None:
    """At least 10,000 random and mutated byte strings per decoder: each decodes to a valid record
    or raises RecordError; nothing else escapes, nothing hangs (the timeout guards that)."""
    rng = random.Random(20261202)
    seeds = [encode(r) for r in seed_records()]
    cases = _mutations(rng, seeds, FUZZ_CASES)
    decoders = [None, *RECORD_TYPES.values()]
    outcome = {"decoded": 0, "refused": 0}
    for cls in decoders:
        for data in cases:
            try:
                record = decode(data, cls)
            except RecordError:
                outcome["refused"] += 1
                continue
            outcome["decoded"] += 1
            assert isinstance(record, cls or Record)
            record.validate()  # what decoded is valid
    assert outcome["decoded"] + outcome["refused"] == FUZZ_CASES * len(decoders)
    # both outcomes must be exercised: mutations that keep a record valid, and ones that break it
    assert outcome["decoded"] > 100 and outcome["refused"] > FUZZ_CASES


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    with contextlib.suppress(RecordError):
        decode(data)


#: A value of every wire type, for every field: the byte-level fuzz above rarely builds a map with
#: a well-formed value of the wrong type where a field belongs. The generic mutations of the fault
#: tests' fuzzer, and an empty array.
EVERY_TYPE: list[Any] = [*WRONG_VALUES, packed([], "uint8")]


def test_every_field_of_every_type_decodes_or_raises_only_record_error() -> None:
    """Each field of every record (and `v` and `t`) set to a value of each wire type: decoding
    gives a valid record or RecordError. A packed array as `v` raised numpy's ValueError from the
    version check, which crashed every consumer (tests/faults/test_fuzz.py found it)."""
    refused = 0
    for record in seed_records():
        good = msgpack.unpackb(encode(record), raw=False)
        for field in good:
            for value in EVERY_TYPE:
                data = msgpack.packb({**good, field: value}, use_bin_type=True)
                for cls in (None, type(record)):
                    try:
                        decode(data, cls).validate()
                    except RecordError:
                        refused += 1
    assert refused > 1000
    array_as_version = msgpack.packb({**good, "v": packed([1, 1], "int32")}, use_bin_type=True)
    with pytest.raises(RecordError, match="schema version"):
        decode(array_as_version)


@pytest.mark.parametrize("n", [1, 5, 64, 65, 500])  # short arrays are checked in Python, long ones in numpy
@pytest.mark.parametrize(
    ("kind", "bad", "words"),
    [
        (Array("float32", finite=True, max=0.0), float("nan"), "must be finite, element {i} is nan"),
        (Array("float32", finite=True, max=0.0), float("-inf"), "must be finite, element {i} is -inf"),
        (Array("float32", finite=True, max=0.0), 0.25, "element {i} is 0.25, above the maximum 0.0"),
        (Array("float32", finite=True), float("inf"), "must be finite, element {i} is inf"),
        (Array("int32", min=0), -3, "element {i} is -3, below the minimum 0"),
        (Array("uint8", min=0, max=1), 2, "element {i} is 2, above the maximum 1"),
        (Array("int8", min=-1), -2, "element {i} is -2, below the minimum -1"),
    ],
)
def test_a_bad_element_is_found_wherever_it_is(n: int, kind: Array, bad: float, words: str) -> None:
    for i in sorted({0, n // 2, n - 1}):
        values = np.zeros(n, dtype=kind.dtype)
        assert kind.check("f", values) is values  # all good: the array itself
        values = values.astype(np.float64)
        values[i] = bad
        with pytest.raises(RecordError) as info:
            kind.check("f", values.astype(kind.dtype) if np.isfinite(bad) else values.astype(np.float32))
        assert info.value.field == "f" and words.format(i=i) in str(info.value), (n, i, str(info.value))


def test_sample_batches_are_per_group_and_policy_and_split_at_the_byte_limit() -> None:
    from astraflow.records import SampleBatch, sample_batches, samples_of

    def sample(gid: str, policy: str, i: int) -> Sample:
        return Sample(
            policy=policy,
            traj_id=f"{gid}#{i}",
            group_id=gid,
            task_id="t",
            env="arith",
            tokens=np.arange(40, dtype=np.int32),
            loss_mask=np.ones(40, np.uint8),
            logprobs=np.full(40, -0.5, np.float32),
            versions=np.zeros(40, np.int32),
            advantages=np.ones(40, np.float32),
            group_size=3,
            group_samples=3,
        )

    samples = [sample(g, p, i) for g in ("a#0", "b#0") for p in ("solver", "verifier") for i in range(3)]
    out = sample_batches(samples, 1 << 20)
    assert [(b.group_id, b.policy, len(b.items)) for b in out] == [
        ("a#0", "solver", 3),
        ("a#0", "verifier", 3),
        ("b#0", "solver", 3),
        ("b#0", "verifier", 3),
    ]
    size = len(encode(samples[0]))
    split = sample_batches(samples[:3], 2 * size)  # room for two a record
    assert [len(b.items) for b in split] == [2, 1]
    back = [s.traj_id for b in split for s in samples_of(decode(encode(b), SampleBatch))]
    assert back == ["a#0#0", "a#0#1", "a#0#2"]
