"""The reader side of the weight store: turn a WeightVersion event into the weights it names.

Workers (and the trainer itself, after a restart) call `fetch_weights(event, held)`:

- if `held` is at `event.version`, it is returned as is;
- if `held` is an earlier version, the delta chain is walked back from the event's delta (each link
  verified by the sha256 its successor names) until it reaches `held.version`; if the chain is
  broken (pruned files) or would cost more bytes than the snapshot, it falls back;
- otherwise the snapshot `event.snapshot_version` is loaded and the deltas after it applied.

The result is checked against the digest of the complete state that the trainer stamped on the
newest file, so what a worker holds is bit-identical to what the trainer published. `held` is
never modified: the result is a new HeldWeights (tensors that no delta touched are shared).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.records import WeightVersion
from astraflow.weights import format as fmt
from astraflow.weights.transport import (
    WeightIntegrityError,
    WeightNotFoundError,
    read_verified,
    resolve,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: A chain longer than this is not walked (the snapshot is cheaper to reason about).
MAX_CHAIN = 1000


@dataclass
class HeldWeights:
    """One version of a policy's weights, as published: `state` maps every state-dict name (tied
    weights share one tensor) to a CPU tensor in the published dtype."""

    version: int
    state: dict[str, torch.Tensor] = field(repr=False)


@dataclass
class _Link:
    uri: str
    version: int
    base: int
    nbytes: int
    tensors: dict[str, Any]
    meta: dict[str, Any]


def fetch_weights(
    event: WeightVersion, held: HeldWeights | None, cache_dir: Path | None = None
) -> HeldWeights:
    """The weights of `event.version`, from `held` plus deltas when possible, else from the snapshot.

    Raises WeightIntegrityError (naming the file) if a file fails its sha256 or is malformed, and
    WeightNotFoundError if the files this event needs are gone from the store.
    """
    if held is not None and held.version == event.version:
        return held
    if held is not None and held.version < event.version and event.delta_uri is not None:
        chain = _walk_chain(event, held.version, cache_dir, byte_budget=event.snapshot_bytes)
        if chain is not None:
            try:
                return _apply_chain(held, chain, event)
            except _Mismatch as exc:
                log.warning(
                    "policy %s: held version %d did not take the delta chain (%s); loading the snapshot",
                    event.policy,
                    held.version,
                    exc,
                )
    return _from_snapshot(event, cache_dir)


class _Mismatch(Exception):
    """Held weights that are not what the trainer published (modified, or another dtype)."""


def _decode(uri: str, data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        return fmt.decode_file(data)
    except fmt.FormatError as exc:
        raise WeightIntegrityError(uri, str(exc)) from None


def _walk_chain(
    event: WeightVersion, stop_at: int, cache_dir: Path | None, byte_budget: int | None
) -> list[_Link] | None:
    """Deltas from `event.version` back to `stop_at`, newest first; None if the chain is broken or
    (with `byte_budget`) the part older than the event's snapshot costs more than the budget."""
    uri, sha, version = event.delta_uri, event.delta_sha256, event.version
    size = event.delta_bytes  # the event names the newest delta's size; older links only their sha
    chain: list[_Link] = []
    extra = 0
    while version > stop_at:
        if uri is None or sha is None or len(chain) >= MAX_CHAIN:
            return None
        try:
            data = read_verified(uri, sha, cache_dir, size=size, limit=_delta_limit(event))
        except WeightNotFoundError as exc:
            log.info("delta chain of %s broken at version %d: %s", event.policy, version, exc)
            return None
        tensors, meta = _decode(uri, data)
        if (
            meta["format"] != fmt.DELTA_FORMAT
            or meta.get("policy") != event.policy
            or meta.get("version") != version
        ):
            raise WeightIntegrityError(
                uri,
                f"expected the delta of {event.policy} version {version}, found "
                f"{meta.get('format')} of {meta.get('policy')} v{meta.get('version')}",
            )
        base = meta.get("base")
        if not isinstance(base, int) or not 0 <= base < version:
            raise WeightIntegrityError(uri, f"delta base {base!r} is not before version {version}")
        chain.append(_Link(uri, version, base, len(data), tensors, meta))
        if version <= event.snapshot_version:
            extra += len(data)
            if byte_budget is not None and extra > byte_budget:
                return None
        if base < stop_at:
            return None
        version = base
        name = meta.get("base_delta") or None
        uri = resolve(uri, name) if name else None
        sha = meta.get("base_delta_sha256") or None
        size = None
    return chain


def _delta_limit(event: WeightVersion) -> int:
    """The most bytes a delta of unknown size may have: a delta rewrites at most every tensor, so
    twice the snapshot (indices and values) plus room for the header bounds it."""
    return 2 * max(event.snapshot_bytes, event.delta_bytes or 0) + (1 << 20)


def _apply_chain(held: HeldWeights, chain: list[_Link], event: WeightVersion) -> HeldWeights:
    aliases = chain[0].meta["aliases"]
    unique = {k: v for k, v in held.state.items() if k not in aliases}
    touched = {k.rsplit("::", 1)[0] for link in chain for k in link.tensors}
    missing = touched - set(unique)
    if missing:
        raise _Mismatch(f"held weights lack {sorted(missing)[:3]}")
    state = {k: (v.detach().to("cpu").clone().contiguous() if k in touched else v) for k, v in unique.items()}
    for link in reversed(chain):
        try:
            fmt.apply_delta(state, link.tensors)
        except fmt.FormatError as exc:
            raise _Mismatch(f"{link.uri}: {exc}") from None
    if fmt.state_digest(state) != chain[0].meta.get("state_sha256"):
        raise _Mismatch("the rebuilt state does not match the published digest")
    return HeldWeights(event.version, fmt.with_aliases(state, aliases))


def _from_snapshot(event: WeightVersion, cache_dir: Path | None) -> HeldWeights:
    uri = event.snapshot_uri
    if not uri:
        raise WeightNotFoundError(f"WeightVersion {event.policy} v{event.version} names no snapshot")
    if event.snapshot_bytes <= 0:  # a bound on what is read must come from the event
        raise WeightIntegrityError(
            uri, f"WeightVersion {event.policy} v{event.version} names no snapshot size"
        )
    data = read_verified(uri, event.snapshot_sha256, cache_dir, size=event.snapshot_bytes)
    state, meta = _decode(uri, data)
    if (
        meta["format"] != fmt.SNAPSHOT_FORMAT
        or meta.get("policy") != event.policy
        or meta.get("version") != event.snapshot_version
    ):
        raise WeightIntegrityError(
            uri,
            f"expected the snapshot of {event.policy} version {event.snapshot_version}"
            f", found {meta.get('format')} of {meta.get('policy')} v{meta.get('version')}",
        )
    if fmt.state_digest(state) != meta.get("state_sha256"):
        raise WeightIntegrityError(uri, "tensors do not match the snapshot's state digest")
    newest_uri, newest_meta = uri, meta
    if event.version > event.snapshot_version:
        chain = _walk_chain(event, event.snapshot_version, cache_dir, byte_budget=None)
        if chain is None:
            raise WeightNotFoundError(
                f"{event.policy}: the deltas from snapshot v{event.snapshot_version} to "
                f"v{event.version} are no longer all in the store ({event.delta_uri})"
            )
        for link in reversed(chain):
            try:
                fmt.apply_delta(state, link.tensors)
            except fmt.FormatError as exc:
                raise WeightIntegrityError(link.uri, str(exc)) from None
        newest_uri, newest_meta = chain[0].uri, chain[0].meta
    if fmt.state_digest(state) != newest_meta.get("state_sha256"):
        raise WeightIntegrityError(
            newest_uri,
            f"state rebuilt from snapshot v{event.snapshot_version} does not match this file's digest",
        )
    return HeldWeights(event.version, fmt.with_aliases(state, newest_meta["aliases"]))
