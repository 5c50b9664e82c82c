"""Field kinds of the wire records: each knows how to check and normalise one value.

A record class declares its fields with these kinds (as dataclass metadata); `Record.validate()`
(records/base.py) walks them. Checks are strict on purpose: a record that passes here is safe
for every consumer, so the components downstream never re-check types, lengths or finiteness.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from astraflow.errors import RecordError

#: Limits that keep one bad record from exhausting a component's memory.
MAX_TOKENS = 262_144
MAX_ID_CHARS = 256
MAX_TEXT_CHARS = 1 << 20
MAX_MAP_ITEMS = 1_024
MAX_JSON_NODES = 100_000
MAX_JSON_DEPTH = 32
MAX_BYTES = 32 << 20
#: The longest Kafka key a dead letter keeps (DeadLetters cuts a longer one: the record is bad anyway).
MAX_KEY_BYTES = 1 << 16

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$")


class Kind:
    """One field's type. `check` returns the normalised value or raises RecordError."""

    def check(self, field: str, value: Any) -> Any:  # pragma: no cover - interface
        raise NotImplementedError


def _fail(field: str, reason: str) -> RecordError:
    return RecordError(field, reason)


def _type_name(value: Any) -> str:
    return type(value).__name__


_S = TypeVar("_S", bound=Sized)


def _sized(field: str, value: _S, nonempty: bool, most: int, unit: str) -> _S:
    """`value` (a map or a list) when it holds at most `most` `unit` (and some, if `nonempty`)."""
    if nonempty and not value:
        raise _fail(field, "must not be empty")
    if len(value) > most:
        raise _fail(field, f"more than {most} {unit} ({len(value)})")
    return value


def _map(field: str, value: Any, nonempty: bool) -> dict[Any, Any]:
    """`value` when it is a map of at most MAX_MAP_ITEMS entries (FloatMap, IntMap, StrMap)."""
    if not isinstance(value, dict):
        raise _fail(field, f"expected a map, got {_type_name(value)}")
    return _sized(field, value, nonempty, MAX_MAP_ITEMS, "entries")


def _list(field: str, value: Any, nonempty: bool, max_items: int) -> list[Any]:
    """`value` as a list (a tuple is one) of at most `max_items` items (StrList, BytesList)."""
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise _fail(field, f"expected a list, got {_type_name(value)}")
    return _sized(field, value, nonempty, max_items, "items")


@dataclass(frozen=True)
class Str(Kind):
    max_chars: int = MAX_ID_CHARS
    nonempty: bool = True
    pattern: re.Pattern[str] | None = None
    choices: tuple[str, ...] | None = None

    def check(self, field: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _fail(field, f"expected a string, got {_type_name(value)}")
        if self.nonempty and not value:
            raise _fail(field, "must not be empty")
        if len(value) > self.max_chars:
            raise _fail(field, f"longer than {self.max_chars} characters ({len(value)})")
        if self.choices is not None and value not in self.choices:
            raise _fail(field, f"{value!r} is not one of {', '.join(self.choices)}")
        if self.pattern is not None and not self.pattern.match(value):
            raise _fail(field, f"{value!r} does not match {self.pattern.pattern}")
        return value


NAME = Str(max_chars=64, pattern=NAME_RE)
SHA256 = Str(max_chars=64, pattern=re.compile(r"^[0-9a-f]{64}$"))


_N = TypeVar("_N", int, float)


def _in_range(field: str, value: _N, low: _N | None, high: _N | None) -> _N:
    """`value` when it lies within the bounds given (Int and Float)."""
    if low is not None and value < low:
        raise _fail(field, f"{value} is below the minimum {low}")
    if high is not None and value > high:
        raise _fail(field, f"{value} is above the maximum {high}")
    return value


@dataclass(frozen=True)
class Int(Kind):
    min: int | None = None
    max: int | None = None

    def check(self, field: str, value: Any) -> int:
        if isinstance(value, np.integer):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(field, f"expected an integer, got {_type_name(value)}")
        return _in_range(field, value, self.min, self.max)


@dataclass(frozen=True)
class Float(Kind):
    min: float | None = None
    max: float | None = None

    def check(self, field: str, value: Any) -> float:
        if isinstance(value, (np.floating, np.integer)):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(field, f"expected a number, got {_type_name(value)}")
        value = float(value)
        if not math.isfinite(value):
            raise _fail(field, f"must be finite, got {value}")
        return _in_range(field, value, self.min, self.max)


@dataclass(frozen=True)
class Bool(Kind):
    def check(self, field: str, value: Any) -> bool:
        if not isinstance(value, (bool, np.bool_)):
            raise _fail(field, f"expected a boolean, got {_type_name(value)}")
        return bool(value)


@dataclass(frozen=True)
class Bytes(Kind):
    max_bytes: int = MAX_BYTES

    def check(self, field: str, value: Any) -> bytes:
        if isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        if not isinstance(value, bytes):
            raise _fail(field, f"expected bytes, got {_type_name(value)}")
        if len(value) > self.max_bytes:
            raise _fail(field, f"larger than {self.max_bytes} bytes ({len(value)})")
        return value


@dataclass(frozen=True)
class BytesList(Kind):
    """A list of byte strings (encoded records), at most `max_items` of them and `max_bytes` in all."""

    max_items: int = 4096
    max_bytes: int = MAX_BYTES

    def check(self, field: str, value: Any) -> list[bytes]:
        value = _list(field, value, nonempty=True, max_items=self.max_items)
        item = Bytes(self.max_bytes)
        out = [item.check(f"{field}[{i}]", v) for i, v in enumerate(value)]
        if sum(map(len, out)) > self.max_bytes:
            raise _fail(field, f"larger than {self.max_bytes} bytes in all")
        return out


@dataclass(frozen=True)
class Array(Kind):
    """A token-level array: one-dimensional, of a fixed dtype, at most MAX_TOKENS long."""

    dtype: str  # numpy dtype name: int8, uint8, int32, float32
    finite: bool = False
    min: float | None = None
    max: float | None = None

    def check(self, field: str, value: Any) -> np.ndarray:
        target = _DTYPES.get(self.dtype) or np.dtype(self.dtype)
        if isinstance(value, np.ndarray):
            arr = value
        elif isinstance(value, (list, tuple)):
            try:
                arr = np.asarray(value)
            except (ValueError, TypeError) as exc:
                raise _fail(field, f"not convertible to an array: {exc}") from None
            if arr.size == 0:
                arr = arr.astype(target)
        else:
            raise _fail(field, f"expected an array of {self.dtype}, got {_type_name(value)}")
        if arr.ndim != 1:
            raise _fail(field, f"expected a one-dimensional array, got {arr.ndim} dimensions")
        if arr.shape[0] > MAX_TOKENS:
            raise _fail(field, f"longer than {MAX_TOKENS} elements ({arr.shape[0]})")
        if arr.dtype != target:
            ok_kind = arr.dtype.kind in ("b", "i", "u") if target.kind in "iu" else arr.dtype.kind in "biuf"
            if not ok_kind:
                raise _fail(field, f"expected {self.dtype} elements, got {arr.dtype}")
            cast = arr.astype(target)
            if target.kind in "iu" and arr.size and not np.array_equal(cast, arr):
                raise _fail(field, f"values do not fit in {self.dtype}")
            arr = cast
        if not arr.size or (not self.finite and self.min is None and self.max is None):
            return arr
        if arr.shape[0] <= SMALL_ARRAY:
            # a short array's elements as Python numbers: a few numpy reductions cost more than
            # these (they are most of a record's validation, and records are validated often)
            items = arr.tolist()
            if self.finite and not all(map(math.isfinite, items)):
                self._not_finite(field, arr)
            lo, hi = (min(items), max(items)) if self.min is not None or self.max is not None else (0, 0)
        else:
            if self.finite and not np.isfinite(arr).all():
                self._not_finite(field, arr)
            lo = arr.min() if self.min is not None else 0
            hi = arr.max() if self.max is not None else 0
        if self.min is not None and lo < self.min:
            raise _fail(field, f"element {int(arr.argmin())} is {arr.min()}, below the minimum {self.min}")
        if self.max is not None and hi > self.max:
            raise _fail(field, f"element {int(arr.argmax())} is {arr.max()}, above the maximum {self.max}")
        return arr

    @staticmethod
    def _not_finite(field: str, arr: np.ndarray) -> None:
        bad = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise _fail(field, f"must be finite, element {bad} is {arr[bad]}")


#: arrays up to this long are checked element by element in Python (faster than numpy below ~100)
SMALL_ARRAY = 64
_DTYPES = {name: np.dtype(name) for name in ("int8", "uint8", "int32", "float32")}


@dataclass(frozen=True)
class FloatMap(Kind):
    """A map from names to finite floats (rewards per policy, metric values, timings)."""

    key: Str = Str(max_chars=128)
    min: float | None = None
    max: float | None = None
    nonempty: bool = False

    def check(self, field: str, value: Any) -> dict[str, float]:
        value = _map(field, value, self.nonempty)
        number = self._values
        out: dict[str, float] = {}
        for k, v in value.items():
            try:  # the field's name is spelt out only for an error: building it cost more than the check
                out[self.key.check("", k)] = number.check("", v)
            except RecordError:
                number.check(f"{field}.{self.key.check(f'{field} key', k)}", v)  # raises, naming it
                raise
        return out

    @functools.cached_property
    def _values(self) -> Kind:
        """The kind of the values, made once per map kind (checking a map made it at every call)."""
        return self._number()

    def _number(self) -> Kind:
        return Float(min=self.min, max=self.max)


@dataclass(frozen=True)
class IntMap(FloatMap):
    """A map from names to integers (weight versions per policy)."""

    def _number(self) -> Kind:
        return Int(
            min=None if self.min is None else int(self.min), max=None if self.max is None else int(self.max)
        )


@dataclass(frozen=True)
class StrMap(Kind):
    key: Str = NAME
    value: Str = NAME
    nonempty: bool = True

    def check(self, field: str, value: Any) -> dict[str, str]:
        value = _map(field, value, self.nonempty)
        return {
            self.key.check(f"{field} key", k): self.value.check(f"{field}.{k}", v) for k, v in value.items()
        }


@dataclass(frozen=True)
class StrList(Kind):
    item: Str = NAME
    max_items: int = 127
    nonempty: bool = True
    unique: bool = True

    def check(self, field: str, value: Any) -> list[str]:
        value = _list(field, value, self.nonempty, self.max_items)
        out = [self.item.check(f"{field}[{i}]", v) for i, v in enumerate(value)]
        if self.unique and len(set(out)) != len(out):
            raise _fail(field, "items must be unique")
        return out


@dataclass(frozen=True)
class Json(Kind):
    """Free-form, msgpack-native data (a task's payload): maps with string keys, lists, strings,
    integers, finite floats, booleans and nil, bounded in depth and size."""

    def check(self, field: str, value: Any) -> Any:
        budget = [MAX_JSON_NODES]
        return self._walk(field, value, 0, budget)

    def _walk(self, path: str, value: Any, depth: int, budget: list[int]) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise _fail(path, f"more than {MAX_JSON_NODES} values")
        if depth > MAX_JSON_DEPTH:
            raise _fail(path, f"nested deeper than {MAX_JSON_DEPTH}")
        if value is None or isinstance(value, (bool, int)):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _fail(path, f"must be finite, got {value}")
            return value
        if isinstance(value, str):
            if len(value) > MAX_TEXT_CHARS:
                raise _fail(path, f"longer than {MAX_TEXT_CHARS} characters")
            return value
        if isinstance(value, (list, tuple)):
            return [self._walk(f"{path}[{i}]", v, depth + 1, budget) for i, v in enumerate(value)]
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise _fail(path, f"map keys must be strings, got {_type_name(k)}")
                out[k] = self._walk(f"{path}.{k}", v, depth + 1, budget)
            return out
        raise _fail(path, f"unsupported type {_type_name(value)}")


@dataclass(frozen=True)
class Optional(Kind):
    inner: Kind

    def check(self, field: str, value: Any) -> Any:
        return None if value is None else self.inner.check(field, value)
