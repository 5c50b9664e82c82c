"""`group`: collect a group's trajectories until it is complete (or timed out), exactly once.

State lives in two tables (Faust tables in the app, plain dicts in unit tests), both keyed so that
a group's entries sit in the changelog partition of the `trajectories` partition it came from:

    groups  group_id -> meta: an `OpenGroup` while pending or intent, a `DoneGroup` after
    bodies  traj_id -> the trajectory's bytes as consumed (already validated, so a msgpack map), or
            a *run*: a msgpack array of the bytes of the trajectories a record added from this one
            on (`GroupCollector.add_record`)

The metas are TypedDicts, not dataclasses: the tables hold (and the changelog stores, msgpack
encoded) exactly these dicts, in this key order, so a restarted worker reads what an older one wrote
(tests/streams/test_state_format.py holds bytes written before the types existed).

Life of a group: `pending` while trajectories arrive (a repeated traj_id is dropped as
`duplicate`); when it holds `group_size` distinct trajectories, or its timeout passes, the app
writes `intent` (flushed to the changelog before any Sample is produced), produces the Samples,
then marks it `done` and, once that tombstone is acknowledged, deletes its bodies (`mark_done`:
the tables have changelogs of their own, so the other order let a crash keep the deletes and lose
the tombstone). A trajectory of a `done` group is dropped as `late`; `done` entries are forgotten
after `dedupe_ttl_s`. An `intent` found after a restart means the previous run may have produced
some of the Samples: the app reads them back before producing the rest (see streams/emit.py).
A group that one record brings complete (a worker's TrajectoryBatch, the usual case) skips the
`pending` writes when the caller holds that record's offset uncommitted until the group is done
(`add_record(..., hold=True)`): the record itself is then the group's durable state, and its meta
and bodies stay in memory (`held`). Its first changelog write is its intent; after a crash before
it is done, the uncommitted record is delivered again (and repairs the bodies of an intent that
was durable). That saves three of a group's six changelog writes (its pending meta, its body
entry and that entry's delete).
This module only decides; it never talks to Kafka.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal, NotRequired, Protocol, TypedDict

import msgpack

from astraflow.config.streams import GroupConfig
from astraflow.errors import RecordError
from astraflow.records import Trajectory, decode

PENDING: Final = "pending"
INTENT: Final = "intent"
DONE: Final = "done"
Action = Literal["complete", "timeout_emit", "timeout_drop", "expire"]


class OpenGroup(TypedDict):
    """A group collecting trajectories (`pending`) or being emitted (`intent`)."""

    p: int  # the `trajectories` partition it came from; its changelog writes go there too
    state: Literal["pending", "intent"]
    first: float  # arrival time of its first trajectory (the timeout counts from it)
    size: int  # group_size of its first trajectory
    ids: list[str]  # traj_ids, in arrival order
    offs: list[int]  # their source offsets, in `ids` order (-1: unknown)
    task: str
    env: str
    policies: list[str]  # the union of its trajectories' policies, in first-seen order
    at: NotRequired[float]  # intent: when it was written
    targets: NotRequired[list[list[Any]]]  # intent: the [topic, partition] its Samples go to


class DoneGroup(TypedDict):
    """The tombstone of an emitted or dropped group, kept `dedupe_ttl_s` to drop late copies."""

    p: int
    state: Literal["done"]
    at: float  # when it was emitted or dropped


GroupMeta = OpenGroup | DoneGroup


def pack_run(bodies: list[bytes]) -> bytes:
    """The body entry of several trajectories (their bytes as consumed, in order)."""
    return msgpack.packb(bodies, use_bin_type=True)


def is_run(body: bytes | None) -> bool:
    """A run, not one trajectory's bytes: a msgpack array where a record is a map."""
    return bool(body) and (0x90 <= body[0] <= 0x9F or body[0] in (0xDC, 0xDD))  # type: ignore[index]


def unpack_run(body: bytes) -> list[bytes]:
    return list(msgpack.unpackb(body, raw=False, use_list=True))


def group_of(body: bytes) -> str | None:
    """The group_id of a body entry's trajectories (None: unreadable, which no entry written by
    `add_record` is)."""
    first = (unpack_run(body) or [b""])[0] if is_run(body) else body
    try:
        return decode(first, Trajectory).group_id
    except RecordError:
        return None


class Table(Protocol):
    """A key-value table whose writes name the changelog partition they belong to."""

    def get(self, key: str) -> Any: ...
    def set(self, key: str, value: Any, partition: int) -> None: ...
    def delete(self, key: str, partition: int) -> None: ...
    def items(self) -> Iterable[tuple[str, Any]]: ...
    def set_local(self, key: str, value: Any) -> None:
        """Change the in-memory data only: no changelog record."""

    def delete_local(self, key: str) -> None:
        """Delete from the in-memory data only: no changelog record."""


class DictTable:
    """An in-memory Table (unit tests, and the reference behaviour of the Faust adapter)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.writes: list[tuple[str, Any, int]] = []

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def set(self, key: str, value: Any, partition: int) -> None:
        self.data[key] = value
        self.writes.append((key, value, partition))

    def delete(self, key: str, partition: int) -> None:
        self.data.pop(key, None)
        self.writes.append((key, None, partition))

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(list(self.data.items()))

    def set_local(self, key: str, value: Any) -> None:
        self.data[key] = value

    def delete_local(self, key: str) -> None:
        self.data.pop(key, None)


@dataclass(frozen=True)
class Added:
    """What `GroupCollector.add` did with one trajectory."""

    outcome: Literal["added", "duplicate", "late", "inconsistent"]
    ready: bool = False  # the group is complete and not yet emitted
    reason: str = ""


class GroupCollector:
    """The group state machine over `groups` and `bodies` tables."""

    def __init__(self, config: GroupConfig, groups: Table, bodies: Table) -> None:
        self.config, self.groups, self.bodies = config, groups, bodies
        #: the open groups whose bodies are in memory only (`add_record(..., hold=True)`)
        self.held: set[str] = set()

    def meta(self, gid: str) -> GroupMeta | None:
        return self.groups.get(gid)

    def metas(self) -> Iterable[tuple[str, GroupMeta | None]]:
        return self.groups.items()

    def add(self, traj: Trajectory, raw: bytes, partition: int, now: float, offset: int = -1) -> Added:
        """Add one trajectory (see `add_record`)."""
        return self.add_record([(traj, raw)], partition, now, offset)[0]

    def add_record(
        self,
        items: list[tuple[Trajectory, bytes]],
        partition: int,
        now: float,
        offset: int = -1,
        hold: bool = False,
    ) -> list[Added]:
        """Add the trajectories of one record (all of one group: a Trajectory, or the items of a
        TrajectoryBatch), each with its bytes. Each is `added`, a `duplicate` (its traj_id is
        already in the group), `late` (the group is done) or `inconsistent` with the group; `ready`
        says whether the group is complete after the whole record.

        A record costs two table writes however many trajectories it holds: the group's meta, and
        one body entry under the first new traj_id holding the new trajectories' bytes (a list of
        them when there are several; see `bodies_of`). Per trajectory, the changelog writes were
        most of the streams worker's produce calls.

        `hold`: the caller will not commit this record's offset before the group is done (or
        `persist`ed). A record that alone brings a new group complete then costs no write at all:
        its meta and body stay in memory, and the group is in `held` (as long as it is, the offset
        of any record of the group must wait for it)."""
        if not items:
            return []
        gid = items[0][0].group_id
        if any(traj.group_id != gid for traj, _ in items):
            raise ValueError(f"a record's trajectories must all be of one group ({gid!r})")
        found = self.meta(gid)
        if found is not None and found["state"] == DONE:
            return [Added("late") for _ in items]
        first = items[0][0]
        meta: OpenGroup = (
            found
            if found is not None
            else OpenGroup(
                p=partition,
                state=PENDING,
                first=now,
                size=first.group_size,
                ids=[],
                offs=[],
                task=first.task_id,
                env=first.env,
                policies=list(first.policies),
            )
        )
        ids, offs, policies = list(meta["ids"]), list(meta["offs"]), list(meta["policies"])
        stored, fresh = set(ids), set()
        outcomes: list[tuple[str, str]] = []
        new: list[bytes] = []
        repairs: list[tuple[str, bytes]] = []
        for traj, raw in items:
            bad = self._inconsistent(meta, traj)
            if bad:
                outcomes.append(("inconsistent", bad))
                continue
            if traj.traj_id in stored or traj.traj_id in fresh:
                if traj.traj_id in stored:
                    repairs.append((traj.traj_id, raw))
                outcomes.append(("duplicate", ""))
                continue
            ids.append(traj.traj_id)
            fresh.add(traj.traj_id)
            offs.append(offset)
            # The group's policies are the union of its trajectories' (views may list different ones).
            policies += [p for p in traj.policies if p not in policies]
            new.append(raw)
            outcomes.append(("added", ""))
        if repairs:
            # a crash persisted the group's meta but not these bodies (two changelog topics): the
            # re-delivered trajectories repair them, each in an entry of its own
            have = {tid for tid, body in self.bodies_of(gid) if body is not None}
            for tid, raw in repairs:
                if tid not in have:
                    self.bodies.set(tid, raw, meta["p"])
        if new:
            head = ids[len(meta["ids"])]
            body = new[0] if len(new) == 1 else pack_run(new)
            meta = {**meta, "ids": ids, "offs": offs, "policies": policies}
            if hold and found is None and len(new) == len(items) and self.ready(meta):
                self.bodies.set_local(head, body)  # the uncommitted record is their durable copy
                self.groups.set_local(gid, meta)
                self.held.add(gid)
            else:
                self.bodies.set(head, body, meta["p"])
                self.groups.set(gid, meta, meta["p"])
        ready = self.ready(meta)
        return [
            Added(outcome, ready=ready and outcome != "inconsistent", reason=reason)  # type: ignore[arg-type]
            for outcome, reason in outcomes
        ]

    @staticmethod
    def _inconsistent(meta: OpenGroup, traj: Trajectory) -> str:
        if traj.group_size != meta["size"]:
            return f"group_size {traj.group_size} differs from {meta['size']} of the group's first trajectory"
        if traj.task_id != meta["task"]:
            return f"task_id {traj.task_id!r} differs from {meta['task']!r} of the group"
        return ""

    @staticmethod
    def ready(meta: GroupMeta) -> bool:
        return meta["state"] != DONE and len(meta["ids"]) >= meta["size"]

    def due(self, now: float, partitions: set[int] | None = None) -> list[tuple[str, Action]]:
        """Groups the sweep must act on, in the given partitions (all if None)."""
        out: list[tuple[str, Action]] = []
        for gid, meta in self.metas():
            if meta is None or (partitions is not None and meta["p"] not in partitions):
                continue
            if meta["state"] == DONE:
                if now - meta["at"] >= self.config.dedupe_ttl_s:
                    out.append((gid, "expire"))
            elif self.ready(meta):
                out.append((gid, "complete"))
            elif now - meta["first"] >= self.config.timeout_s:
                emit = self.config.on_timeout == "emit" and len(meta["ids"]) >= self.config.min_size
                out.append((gid, "timeout_emit" if emit else "timeout_drop"))
        return out

    def bodies_of(self, gid: str) -> list[tuple[str, bytes | None]]:
        """(traj_id, bytes) of the group's trajectories, in `ids` order; bytes None where a crash
        lost them. A body entry holds one trajectory's bytes, or a list of the bytes of the
        trajectories from its key onwards (`add_record`); no entry under a traj_id means it is in
        an entry before it, or lost."""
        meta: OpenGroup | None = self.groups.get(gid)  # never called on a done group
        if not meta:
            return []
        ids, out, i = meta["ids"], [], 0
        while i < len(ids):
            body = self.bodies.get(ids[i])
            if is_run(body):
                run = unpack_run(body)[: len(ids) - i]
                out += zip(ids[i : i + len(run)], run, strict=True)
                i += max(len(run), 1)
            else:
                out.append((ids[i], body))
                i += 1
        return out

    @staticmethod
    def offsets(meta: OpenGroup) -> list[int]:
        """Source offsets of the group's trajectories, in `ids` order."""
        return list(meta.get("offs") or [-1] * len(meta["ids"]))

    def mark_intent(self, gid: str, at: float, targets: list[tuple[str, int]]) -> OpenGroup:
        open_meta: OpenGroup = self.groups.get(gid)
        meta: OpenGroup = {**open_meta, "state": INTENT, "at": at, "targets": [list(t) for t in targets]}
        self.groups.set(gid, meta, meta["p"])
        return meta

    def mark_done(self, gid: str, now: float) -> list[str]:
        """Emitted (or dropped): keep a small tombstone for dedupe. Returns the keys of the group's
        body entries, for `delete_bodies` once the tombstone is acknowledged, not before: the two
        tables have changelogs of their own, and a crash that kept the deletes but lost the
        tombstone left the group open without its trajectories, waiting for ever for the
        re-delivery of records whose offsets were committed long before."""
        meta: OpenGroup = self.groups.get(gid)
        keys = [tid for tid in meta["ids"] if self.bodies.get(tid) is not None]
        self.groups.set(gid, DoneGroup(p=meta["p"], state=DONE, at=now), meta["p"])
        if gid in self.held:  # its bodies were never written to the changelog
            self.held.discard(gid)
            for key in keys:
                self.bodies.delete_local(key)
            return []
        return keys

    def persist(self, gid: str) -> bool:
        """Write a held group's meta and bodies to the changelog, so that its record's offset may be
        committed before the group is done (the flush before that commit makes them durable).
        False if the group is not held."""
        if gid not in self.held:
            return False
        self.held.discard(gid)
        meta: OpenGroup = self.groups.get(gid)
        for key in meta["ids"]:
            body = self.bodies.get(key)
            if body is not None:
                self.bodies.set(key, body, meta["p"])
        self.groups.set(gid, meta, meta["p"])
        return True

    def delete_bodies(self, gid: str, keys: Iterable[str], partition: int) -> int:
        """Delete the body entries `keys` of the done group `gid` (one delete per entry still
        there); none if the group is open again (forgotten, then sent anew: they are its own)."""
        meta = self.meta(gid)
        if meta is not None and meta["state"] != DONE:
            return 0
        deleted = 0
        for key in keys:
            if self.bodies.get(key) is not None:
                self.bodies.delete(key, partition)
                deleted += 1
        return deleted

    def delete_orphans(self, partitions: set[int] | None = None, unacked: Container[str] = ()) -> int:
        """Delete the body entries a crash left behind: those of a done group (in `partitions`, all
        if None) that no open group refers to. A crash after a tombstone was durable and before
        the deletes were leaves them; a tombstone not yet acknowledged (its group in `unacked`)
        keeps them, as does a group that is unknown or open: its meta's write was lost with a
        record that was never committed, whose re-delivery writes the entry again. Run once the
        tables are recovered; returns how many entries it deleted."""
        referenced = {
            tid
            for _, meta in self.metas()
            if meta is not None and meta["state"] != DONE
            for tid in meta["ids"]
        }
        deleted = 0
        for key, body in self.bodies.items():
            if key in referenced or not body:
                continue
            gid = group_of(body)
            meta = self.meta(gid) if gid is not None and gid not in unacked else None
            if meta is not None and meta["state"] == DONE and (partitions is None or meta["p"] in partitions):
                self.bodies.delete(key, meta["p"])
                deleted += 1
        return deleted

    def forget(self, gid: str) -> None:
        meta = self.meta(gid)
        if meta is not None:
            self.groups.delete(gid, meta["p"])

    def pending(self) -> int:
        return sum(1 for _, m in self.metas() if m is not None and m["state"] != DONE)
