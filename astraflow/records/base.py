"""`Record`, the base of every wire record, and `wire`, the field that carries its wire kind.

Each record (records/types.py) is a plain dataclass whose fields carry their kind
(records/fields.py) as metadata. `Record.validate()` checks and normalises every field plus the
cross-field rules (equal token-level lengths, owners that index the policy list, rewards for
exactly the listed policies). A record validates when it is built and when it is decoded; encoding
validates it again if a field was assigned since (see `Record.unchanged`), so no component can emit
or accept a malformed record.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, ClassVar

import numpy as np

from astraflow.errors import RecordError
from astraflow.records.fields import Kind


def wire(kind: Kind, **kwargs: Any) -> Any:
    """A dataclass field that carries its wire kind."""
    return field(metadata={"kind": kind}, **kwargs)


class Record:
    """Base of all wire records: field-by-field validation plus per-type cross-field rules."""

    TYPE: ClassVar[str]
    #: Fields that must all have the same length (token-level arrays).
    TOKEN_FIELDS: ClassVar[tuple[str, ...]] = ()
    # declared, not set: every record class is a dataclass (what `dataclasses.fields` takes), and
    # `wire_fields` caches its answer in the class's own __dict__
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    _wire_fields: ClassVar[tuple[tuple[str, Kind], ...]]

    def __post_init__(self) -> None:
        # A record is valid from birth: construction normalises (lists become typed arrays) and
        # raises RecordError naming the field, so an invalid record never exists in a component.
        self.validate()

    @classmethod
    def wire_fields(cls) -> tuple[tuple[str, Kind], ...]:
        """(name, wire kind) of each field, in order (computed once per class: `dataclasses.fields`
        builds its tuple at every call, and validation asks at every record)."""
        found = cls.__dict__.get("_wire_fields")
        if found is None:
            found = tuple((f.name, f.metadata["kind"]) for f in dataclasses.fields(cls))
            cls._wire_fields = found
        return found

    def validate(self, known_policies: frozenset[str] | None = None) -> Record:
        """Check and normalise every field in place; return self. Raises RecordError."""
        try:
            checked = []
            for name, kind in self.wire_fields():
                value = kind.check(name, getattr(self, name))
                setattr(self, name, value)
                checked.append(value)
            if self.TOKEN_FIELDS:
                lengths = {name: len(getattr(self, name)) for name in self.TOKEN_FIELDS}
                first = self.TOKEN_FIELDS[0]
                for name, n in lengths.items():
                    if n != lengths[first]:
                        raise RecordError(name, f"has {n} elements but {first} has {lengths[first]}")
            self._check(known_policies)
        except RecordError as exc:
            self._name(exc)
            raise
        self._checked = checked
        return self

    def unchanged(self) -> bool:
        """Whether every field still holds the value the last validation returned (the same object):
        then it need not be checked again before encoding. A field assigned since is not, whatever
        its value; an array or map changed in place is, so the consumer's decode remains the check
        that counts (every consumer validates what it decodes)."""
        checked = self.__dict__.get("_checked")
        if checked is None:
            return False
        for (name, _), value in zip(self.wire_fields(), checked, strict=True):
            if getattr(self, name) is not value:
                return False
        return True

    def check_policies(self, known_policies: frozenset[str]) -> Record:
        """The cross-field rules again, now against the known policies; return self. For a record
        whose fields were checked when it was built (decoding checks each record once)."""
        try:
            self._check(known_policies)
        except RecordError as exc:
            self._name(exc)
            raise
        return self

    def _name(self, exc: RecordError) -> None:
        exc.record_type = self.TYPE
        exc.args = (f"{self.TYPE}.{exc.field}: {exc.reason}",)

    def _check(self, known_policies: frozenset[str] | None) -> None:
        """Cross-field rules of one record type."""

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name, _ in self.wire_fields()}

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for fld in dataclasses.fields(self):
            a, b = getattr(self, fld.name), getattr(other, fld.name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
                    return False
                if a.dtype != b.dtype or not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]
