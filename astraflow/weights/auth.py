"""Authenticated WeightVersion events: whoever can write to `weights` must not choose the weights.

The trainer signs each event with an HMAC-SHA256 under the run's secret (ASTRAFLOW_WEIGHTS_SECRET,
set by `astraflow run --secure` for trainers, workers and the feeder); readers verify it before
they use the event, and one that is unsigned, altered or signed with another key fails as a
RecordError, so it goes to `deadletter` like any other bad record instead of being applied. The
MAC covers the event's whole encoding without the `mac` field, so every field (URIs, sha256s,
version, groups_consumed) is covered. Without a secret, events are neither signed nor checked (the
PLAINTEXT default).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os

from astraflow.records import RecordError, WeightVersion, encode

SECRET_ENV = "ASTRAFLOW_WEIGHTS_SECRET"  # noqa: S105 - the name of the variable


def run_secret() -> str | None:
    """The run's secret from the environment, or None where events are not authenticated."""
    return os.environ.get(SECRET_ENV) or None


def mac_of(event: WeightVersion, secret: str) -> str:
    """HMAC-SHA256 (hex) of the event's encoding without its `mac`."""
    body = encode(dataclasses.replace(event, mac=None))
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def sign(event: WeightVersion, secret: str | None = None) -> WeightVersion:
    """The event with its MAC under `secret` (default: the run's); unchanged without a secret."""
    secret = secret if secret is not None else run_secret()
    return dataclasses.replace(event, mac=mac_of(event, secret)) if secret else event


def verify(event: WeightVersion, secret: str | None = None) -> WeightVersion:
    """`event` if its MAC is right under `secret` (default: the run's); a RecordError otherwise."""
    secret = secret if secret is not None else run_secret()
    if not secret:
        return event
    if event.mac is None:
        raise RecordError("mac", "missing: this run accepts only WeightVersion events signed with its secret")
    if not hmac.compare_digest(event.mac, mac_of(event, secret)):
        raise RecordError(
            "mac", "does not match: the event was forged, altered, or signed with another secret"
        )
    return event
