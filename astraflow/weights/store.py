"""The writer side of the weight store, used by a policy's trainer (one writer per policy).

Layout under the store root (a local or shared directory; `WeightServer` can serve it over HTTP):

    <root>/<policy>/manifest.json                 versions -> snapshot / delta files, sha256, sizes
    <root>/<policy>/objects/<sha256>.snapshot.safetensors
    <root>/<policy>/objects/<sha256>.delta.safetensors[.zst]

Objects are content-addressed (named by the sha256 of their bytes) and written atomically (temp
file, fsync, rename), then the manifest is replaced atomically, so a reader never sees a partial
file and a crash leaves at worst an unreferenced object that the next prune removes.

Every version after 0 gets a delta from its predecessor; every `snapshot_every`-th version (and
version 0) also gets a full snapshot. `publish` returns the WeightVersion event to send. Pruning
keeps what a worker may still need: for each of the last `keep_versions` events, its snapshot and
the deltas after it, which also lets a worker holding any of those versions catch up by deltas.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.records import WeightVersion
from astraflow.weights import format as fmt
from astraflow.weights.fetch import HeldWeights, fetch_weights
from astraflow.weights.transport import WeightStoreError, sha256_of

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
OBJECT_RE = re.compile(r"^[0-9a-f]{64}\.(snapshot|delta)\.safetensors(\.zst)?$")


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either nothing or all of it, even after a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class WeightStore:
    """Content-addressed snapshots and deltas of one policy, with a manifest and pruning."""

    def __init__(
        self,
        root: str | Path,
        policy: str,
        *,
        snapshot_every: int = 10,
        keep_versions: int = 8,
        compress_level: int = 1,
        dtype: str = "bfloat16",
        base_uri: str | None = None,
    ) -> None:
        if snapshot_every < 1 or keep_versions < 1:
            raise ValueError("snapshot_every and keep_versions must be at least 1")
        self.root = Path(root).resolve()
        self.policy = policy
        self.snapshot_every = snapshot_every
        self.keep_versions = keep_versions
        self.compress_level = compress_level
        self.dtype = dtype
        self.dir = self.root / policy
        self.objects = self.dir / "objects"
        self.objects.mkdir(parents=True, exist_ok=True)
        root_uri = base_uri if base_uri is not None else self.root.as_uri()
        self.base_uri = root_uri if root_uri.endswith("/") else root_uri + "/"
        self._torch_dtype = fmt.torch_dtype(dtype)
        self.manifest: dict[str, Any] = self._read_manifest()
        self._last: HeldWeights | None = None  # the latest published state, for the next delta

    # ------------------------------------------------------------------ manifest

    def _read_manifest(self) -> dict[str, Any]:
        path = self.dir / MANIFEST
        if not path.exists():
            return {"policy": self.policy, "format": 1, "versions": {}}
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise WeightStoreError(f"{path}: unreadable manifest: {exc}") from None
        if data.get("policy") != self.policy:
            raise WeightStoreError(f"{path}: manifest of policy {data.get('policy')!r}, not {self.policy!r}")
        return data

    def _save_manifest(self) -> None:
        # compact: json's C encoder (with an indent it encodes in Python: 2 ms of every publication)
        write_atomic(
            self.dir / MANIFEST, json.dumps(self.manifest, sort_keys=True, separators=(",", ":")).encode()
        )

    @property
    def versions(self) -> list[int]:
        return sorted(int(v) for v in self.manifest["versions"])

    @property
    def latest(self) -> int | None:
        vs = self.versions
        return vs[-1] if vs else None

    def entry(self, version: int) -> dict[str, Any]:
        try:
            return self.manifest["versions"][str(version)]
        except KeyError:
            raise WeightStoreError(
                f"{self.policy}: version {version} is not in the store (have {self.versions})"
            ) from None

    def uri(self, name: str, base_uri: str | None = None) -> str:
        return f"{base_uri or self.base_uri}{self.policy}/objects/{name}"

    # ------------------------------------------------------------------ writing

    def _put(self, data: bytes, kind: str, compressed: bool) -> dict[str, Any]:
        sha = sha256_of(data)
        name = f"{sha}.{kind}.safetensors" + (".zst" if compressed else "")
        path = self.objects / name
        if not (path.exists() and path.stat().st_size == len(data)):
            write_atomic(path, data)
        return {"file": name, "sha256": sha, "bytes": len(data)}

    def publish(
        self, state: dict[str, torch.Tensor], version: int, step: int = 0, snapshot: bool = False
    ) -> WeightVersion:
        """Store `state` (cast to the store dtype) as `version` and return its event.

        `version` must follow the latest one; version 0, a store without versions, or
        `snapshot=True` with a gap write a snapshot only (no delta base)."""
        latest = self.latest
        unique, aliases = fmt.split_aliases(state)
        # one copy of a (contiguous) parameter: a cast then a clone copied a float32 state twice
        unique = {
            k: v.detach()
            .to("cpu", self._torch_dtype if v.is_floating_point() else v.dtype, copy=True)
            .contiguous()
            for k, v in unique.items()
        }
        if latest is not None and version <= latest:
            raise WeightStoreError(f"{self.policy}: version {version} is not after the latest {latest}")
        chained = latest is not None and version == latest + 1
        if not chained and not (snapshot or version == 0 or latest is None):
            raise WeightStoreError(
                f"{self.policy}: version {version} does not follow {latest}; pass snapshot=True"
            )
        digest = fmt.state_digest(unique)
        entry: dict[str, Any] = {
            "version": version,
            "step": step,
            "created_at": time.time(),
            "snapshot": None,
            "delta": None,
        }
        if chained:
            assert latest is not None
            prev = self._previous_state(latest)
            compressed = self.compress_level > 0
            tensors, changed, total = fmt.diff_states(
                prev, unique, fmt.COMPRESSED_FULL_FROM if compressed else None
            )
            base_delta = self.entry(latest)["delta"]
            data = fmt.encode_delta(
                tensors,
                aliases,
                self.policy,
                version,
                latest,
                base_delta["file"] if base_delta else "",
                base_delta["sha256"] if base_delta else "",
                digest,
                changed,
                total,
            )
            entry["delta"] = {
                **self._put(fmt.compress(data, self.compress_level), "delta", compressed),
                "base": latest,
                "changed": changed,
                "total": total,
            }
        if not chained or snapshot or version % self.snapshot_every == 0:
            entry["snapshot"] = self._put(
                fmt.encode_snapshot(unique, aliases, self.policy, version, digest), "snapshot", False
            )
            entry["snapshot_version"] = version
        else:
            assert latest is not None  # chained: a delta on the latest version
            entry["snapshot_version"] = self.entry(latest)["snapshot_version"]
        self.manifest["versions"][str(version)] = entry
        self._last = HeldWeights(version, fmt.with_aliases(unique, aliases))
        self.prune(save=True)  # one manifest write (and fsync) for the new entry and the dropped ones
        return self.event(version)

    def _previous_state(self, latest: int) -> dict[str, torch.Tensor]:
        if self._last is None or self._last.version != latest:
            self._last = self.load(latest)
        aliases = fmt.split_aliases(self._last.state)[1]
        return {k: v for k, v in self._last.state.items() if k not in aliases}

    # ------------------------------------------------------------------ reading back

    def event(self, version: int, base_uri: str | None = None) -> WeightVersion:
        """The WeightVersion event of a stored version (to announce it, or announce it again)."""
        entry = self.entry(version)
        snap = self.entry(entry["snapshot_version"])["snapshot"]
        delta = entry["delta"]
        return WeightVersion(
            policy=self.policy,
            version=version,
            step=entry["step"],
            snapshot_version=entry["snapshot_version"],
            snapshot_uri=self.uri(snap["file"], base_uri),
            snapshot_sha256=snap["sha256"],
            snapshot_bytes=snap["bytes"],
            delta_uri=self.uri(delta["file"], base_uri) if delta else None,
            delta_base=delta["base"] if delta else None,
            delta_sha256=delta["sha256"] if delta else None,
            delta_bytes=delta["bytes"] if delta else None,
            changed_fraction=(delta["changed"] / max(delta["total"], 1)) if delta else None,
            dtype=self.dtype,
            created_at=entry["created_at"],
        )

    def load(self, version: int | None = None) -> HeldWeights:
        """Rebuild a stored version from this store's own files (verified like any reader)."""
        version = self.latest if version is None else version
        if version is None:
            raise WeightStoreError(f"{self.policy}: the store is empty")
        # read our own files from disk, even when events advertise HTTP
        return fetch_weights(self.event(version, base_uri=self.root.as_uri() + "/"), None)

    # ------------------------------------------------------------------ retention

    def needed(self) -> set[int]:
        """Versions whose entries a worker may still need (see the module docstring)."""
        vs = self.versions
        if not vs:
            return set()
        # one version more than asked: a worker may still hold the version before the window
        window = vs[-(self.keep_versions + 1) :]
        floor = min(self.entry(v)["snapshot_version"] for v in window)
        return {v for v in vs if v >= floor}

    def prune(self, save: bool = False) -> list[str]:
        """Drop manifest entries and object files no worker can still need. Returns removed files.
        The manifest is written before any file goes (with `save`, even if no entry was dropped)."""
        keep = self.needed()
        dropped = [v for v in self.versions if v not in keep]
        for v in dropped:
            del self.manifest["versions"][str(v)]
        if dropped or save:
            self._save_manifest()
        referenced = {
            part["file"]
            for e in self.manifest["versions"].values()
            for part in (e["snapshot"], e["delta"])
            if part
        }
        removed = []
        for path in self.objects.iterdir():
            if OBJECT_RE.match(path.name) and path.name not in referenced:
                path.unlink(missing_ok=True)
                removed.append(path.name)
            elif path.name.endswith(".tmp") and time.time() - path.stat().st_mtime > 3600:
                path.unlink(missing_ok=True)  # left by a writer that crashed mid-write
        return removed

    def total_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.objects.iterdir() if OBJECT_RE.match(p.name))
