"""WeightVersion HMACs (astraflow.weights.auth): a reader applies only events its run's trainer signed."""

from __future__ import annotations

import dataclasses

import pytest

from astraflow.records import RecordError, WeightVersion, decode, encode
from astraflow.weights import auth

EVENT = WeightVersion(
    policy="solver",
    version=3,
    step=3,
    snapshot_version=3,
    snapshot_uri="file:///w/solver/3",
    snapshot_sha256="a" * 64,
    snapshot_bytes=10,
    created_at=1.0,
    groups_consumed=6,
)


def test_a_signed_event_survives_the_wire_and_verifies() -> None:
    signed = auth.sign(EVENT, "k1")
    assert signed.mac is not None and len(signed.mac) == 64
    back = decode(encode(signed), WeightVersion)
    assert auth.verify(back, "k1") == signed
    # deterministic: the same event and key give the same MAC
    assert auth.sign(EVENT, "k1").mac == signed.mac


@pytest.mark.parametrize(
    "change",
    [
        {"snapshot_uri": "file:///evil"},
        {"snapshot_sha256": "b" * 64},
        {"version": 4},
        {"groups_consumed": 10_000},
        {"policy": "other"},
    ],
)
def test_an_altered_field_fails_the_check(change: dict[str, object]) -> None:
    forged = dataclasses.replace(auth.sign(EVENT, "k1"), **change)
    with pytest.raises(RecordError, match="mac: does not match"):
        auth.verify(forged, "k1")


def test_unsigned_or_signed_with_another_key_is_refused() -> None:
    with pytest.raises(RecordError, match="mac: missing"):
        auth.verify(EVENT, "k1")
    with pytest.raises(RecordError, match="mac: does not match"):
        auth.verify(auth.sign(EVENT, "k2"), "k1")


def test_without_a_secret_nothing_is_signed_or_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auth.SECRET_ENV, raising=False)
    assert auth.sign(EVENT).mac is None
    assert auth.verify(EVENT) is EVENT
    monkeypatch.setenv(auth.SECRET_ENV, "k1")  # the run's secret comes from the environment
    assert auth.sign(EVENT).mac == auth.sign(EVENT, "k1").mac
    with pytest.raises(RecordError):
        auth.verify(EVENT)
