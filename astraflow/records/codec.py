"""msgpack codec for the wire records.

A record travels as a msgpack map: `v` (schema version), `t` (record type) and its fields.
Token-level arrays are msgpack extension values (type 1): one dtype byte, a little-endian uint32
element count, then the raw little-endian buffer, so decoding is a zero-copy `np.frombuffer`.
No pickle anywhere. `decode` raises only RecordError, whatever the bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable
from typing import Any, TypeVar, overload

import msgpack
import numpy as np

from astraflow.errors import RecordError
from astraflow.records.base import Record
from astraflow.records.fields import MAX_BYTES, MAX_TOKENS, Array
from astraflow.records.types import RECORD_TYPES, Sample, SampleBatch, Trajectory, TrajectoryBatch

SCHEMA_VERSION = 1
EXT_NDARRAY = 1

_DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype("int8"): 1,
    np.dtype("uint8"): 2,
    np.dtype("int32"): 3,
    np.dtype("float32"): 4,
}
_CODE_DTYPES = {code: dt.newbyteorder("<") for dt, code in _DTYPE_CODES.items()}
_HEADER = struct.Struct("<BI")

R = TypeVar("R", bound=Record)
S = TypeVar("S", bound=Record)


def _pack_array(arr: np.ndarray) -> msgpack.ExtType:
    code = _DTYPE_CODES[arr.dtype]
    data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
    return msgpack.ExtType(EXT_NDARRAY, _HEADER.pack(code, arr.shape[0]) + data)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _pack_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code != EXT_NDARRAY:
        raise RecordError("<ext>", f"unknown msgpack extension type {code}")
    if len(data) < _HEADER.size:
        raise RecordError("<ext>", "array header is truncated")
    dtype_code, n = _HEADER.unpack_from(data)
    dtype = _CODE_DTYPES.get(dtype_code)
    if dtype is None:
        raise RecordError("<ext>", f"unknown array dtype code {dtype_code}")
    if n > MAX_TOKENS:
        raise RecordError("<ext>", f"array of {n} elements exceeds {MAX_TOKENS}")
    body = memoryview(data)[_HEADER.size :]
    if len(body) != n * dtype.itemsize:
        raise RecordError("<ext>", f"array says {n} x {dtype.itemsize} bytes but carries {len(body)}")
    arr = np.frombuffer(body, dtype=dtype)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def encode(record: Record, known_policies: frozenset[str] | None = None) -> bytes:
    """Encode a record, validating it again if a field was assigned since it was built (a record
    whose fields are the ones its last validation returned is valid: the check is not repeated;
    `known_policies` are checked either way). Raises RecordError if the record is not valid."""
    if not record.unchanged():
        record.validate(known_policies)
    elif known_policies is not None:
        record.check_policies(known_policies)
    body: dict[str, Any] = {"v": SCHEMA_VERSION, "t": record.TYPE}
    for name, _ in record.wire_fields():
        body[name] = getattr(record, name)
    return msgpack.packb(body, default=_default, use_bin_type=True)


@overload
def decode(
    data: bytes | bytearray | memoryview, expected: type[R], known_policies: frozenset[str] | None = None
) -> R: ...


@overload
def decode(
    data: bytes | bytearray | memoryview,
    expected: tuple[type[R], type[S]],
    known_policies: frozenset[str] | None = None,
) -> R | S: ...


@overload
def decode(
    data: bytes | bytearray | memoryview,
    expected: tuple[type[R], ...],
    known_policies: frozenset[str] | None = None,
) -> R: ...


@overload
def decode(
    data: bytes | bytearray | memoryview, expected: None = None, known_policies: frozenset[str] | None = None
) -> Record: ...


def decode(
    data: bytes | bytearray | memoryview,
    expected: type[Record] | tuple[type[Record], ...] | None = None,
    known_policies: frozenset[str] | None = None,
) -> Record:
    """Decode and validate one record. Raises RecordError (and nothing else) on bad input.

    With `expected` (a type, or a tuple of them), a record of another type is an error, found before
    its fields are read; without it any record type decodes.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RecordError("<bytes>", f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_BYTES:
        raise RecordError("<bytes>", f"record of {len(data)} bytes exceeds {MAX_BYTES}")
    try:
        body = msgpack.unpackb(data, raw=False, ext_hook=_ext_hook, strict_map_key=True, use_list=True)
    except RecordError:
        raise
    except (
        ValueError,
        TypeError,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
        UnicodeDecodeError,
        OverflowError,
        RecursionError,
        MemoryError,
    ) as exc:
        raise RecordError("<bytes>", f"not a msgpack record: {type(exc).__name__}: {exc}") from None
    if not isinstance(body, dict):
        raise RecordError("<bytes>", f"expected a msgpack map, got {type(body).__name__}")
    version = body.pop("v", None)
    # type first: a packed array as `v` made `!=` raise numpy's ValueError, which escaped every
    # consumer's dead-letter boundary and crashed it (found by tests/faults/test_fuzz.py)
    if type(version) is not int or version != SCHEMA_VERSION:
        raise RecordError("v", f"unsupported schema version {version!r} (this build reads {SCHEMA_VERSION})")
    type_name = body.pop("t", None)
    cls = RECORD_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise RecordError("t", f"unknown record type {type_name!r}")
    wanted = expected if isinstance(expected, tuple) else (expected,) if expected is not None else ()
    if wanted and cls not in wanted:
        names = " or ".join(w.TYPE for w in wanted)
        raise RecordError("t", f"expected a {names} record, got {type_name}")
    return _build(cls, body, known_policies)


@functools.cache
def _layout(cls: type[Record]) -> tuple[frozenset[str], tuple[str, ...], tuple[tuple[str, str], ...]]:
    """A record type's field names, its required ones, and its arrays with their dtypes."""
    fields = dataclasses.fields(cls)
    required = tuple(
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    arrays = tuple(
        (f.name, f.metadata["kind"].dtype) for f in fields if isinstance(f.metadata["kind"], Array)
    )
    return frozenset(f.name for f in fields), required, arrays


def _build(cls: type[Record], body: dict[str, Any], known_policies: frozenset[str] | None) -> Record:
    names, required, arrays = _layout(cls)  # type: ignore[arg-type]  # a class is hashable
    if not names.issuperset(body):
        unknown = sorted((k for k in body if k not in names), key=repr)
        raise RecordError(str(unknown[0]), "unknown field", cls.TYPE)
    for name in required:
        if name not in body:
            raise RecordError(name, "required field is missing", cls.TYPE)
    for name, dtype in arrays:
        if name in body and not isinstance(body[name], np.ndarray):
            # On the wire, token-level arrays are packed buffers, never lists of numbers.
            raise RecordError(
                name,
                f"expected a packed {dtype} array (msgpack extension "
                f"{EXT_NDARRAY}), got {type(body[name]).__name__}",
                cls.TYPE,
            )
    record = cls(**body)  # validates every field
    return record.check_policies(known_policies) if known_policies is not None else record


def samples_of(record: Record) -> list[Sample]:
    """The Samples a record of `samples.<policy>` carries: itself, or a batch's items (for reports,
    benches and tests: an item that does not decode is left out; the trainer dead-letters it)."""
    return _opened(record, Sample, SampleBatch)


def trajectories_of(record: Record) -> list[Trajectory]:
    """The trajectories a record of `trajectories` carries: itself, or a batch's items (for reports
    and benches: an item that does not decode is left out; streams dead-letters it)."""
    return _opened(record, Trajectory, TrajectoryBatch)


def batch_items(
    batch: TrajectoryBatch | SampleBatch,
    cls: type[R],
    known_policies: frozenset[str] | None,
    check: Callable[[R], R] | None = None,
) -> list[tuple[bytes, R | RecordError]]:
    """Each item of a batch with what it decodes to as `cls` (after `check`, if given), or why it
    cannot be used: a RecordError naming `<batch type>.items[i]`. An item must carry the batch's
    group_id (and, in a SampleBatch, its policy). Streams and the trainer take a batch's items so."""
    same = ("group_id", "policy") if isinstance(batch, SampleBatch) else ("group_id",)
    out: list[tuple[bytes, R | RecordError]] = []
    for i, body in enumerate(batch.items):
        try:
            item = decode(body, cls, known_policies)
            if check is not None:
                item = check(item)
            for name in same:
                if getattr(item, name) != getattr(batch, name):
                    raise RecordError(
                        name, f"{getattr(item, name)!r} is not the batch's {getattr(batch, name)!r}", cls.TYPE
                    )
            out.append((body, item))
        except RecordError as exc:
            out.append((body, RecordError(f"items[{i}]", str(exc), batch.TYPE)))
    return out


def _opened(record: Record, single: type[R], batch: type[Record]) -> list[R]:
    if isinstance(record, single):
        return [record]
    out: list[R] = []
    for item in getattr(record, "items", []) if isinstance(record, batch) else []:
        try:
            out.append(decode(item, single))
        except RecordError:
            continue
    return out


def batches(trajs: list[Trajectory], max_bytes: int) -> list[TrajectoryBatch]:
    """The records a task's trajectories travel in: one TrajectoryBatch per group, split where the
    encoded trajectories would pass `max_bytes` (a trajectory larger than that travels alone)."""
    by_group: dict[str, list[bytes]] = {}
    for traj in trajs:
        by_group.setdefault(traj.group_id, []).append(encode(traj))
    return [
        TrajectoryBatch(group_id=gid, items=chunk)
        for gid, items in by_group.items()
        for chunk in _chunks(items, max_bytes)
    ]


def sample_batches(
    samples: list[Sample], max_bytes: int, known_policies: frozenset[str] | None = None
) -> list[SampleBatch]:
    """The records Samples travel in: one SampleBatch per group and policy, split where the encoded
    Samples would pass `max_bytes` (a Sample larger than that travels alone in its batch)."""
    by_key: dict[tuple[str, str], list[bytes]] = {}
    for sample in samples:
        by_key.setdefault((sample.group_id, sample.policy), []).append(encode(sample, known_policies))
    return [
        SampleBatch(group_id=gid, policy=policy, items=chunk)
        for (gid, policy), items in by_key.items()
        for chunk in _chunks(items, max_bytes)
    ]


def _chunks(items: list[bytes], max_bytes: int) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    chunk: list[bytes] = []
    size = 0
    for item in items:
        if chunk and size + len(item) > max_bytes:
            out.append(chunk)
            chunk, size = [], 0
        chunk.append(item)
        size += len(item)
    return [*out, chunk] if chunk else out
