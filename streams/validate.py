"""`validate`: the first stage. Bytes from `trajectories` become checked Trajectories, or errors.

A record of `trajectories` is one Trajectory, or a TrajectoryBatch: the trajectories of one group
that a worker sends together. Beyond what the codec checks (types, lengths, finiteness, known
policies), a trajectory must be consistent with the ids the rest of the system relies on: its
group_id and traj_id are the ones `astraflow.records.group_id/traj_id` derive from (task_id,
attempt, sample_index), and its Kafka key is its group_id (the group stage relies on a group's
trajectories sharing one partition); a batch's key is its group_id and each of its trajectories
belongs to that group. The Faust adapter sends every failure to `deadletter` with topic, partition,
offset and reason: a bad record whole, a bad trajectory of a good batch alone (with its own bytes).
"""

from __future__ import annotations

from astraflow.errors import RecordError
from astraflow.records import Trajectory, TrajectoryBatch, batch_items, decode, group_id, traj_id

#: One trajectory of a record: its bytes, and the checked Trajectory or why it was refused.
Item = tuple[bytes, Trajectory | RecordError]


class Validate:
    """The checks of `streams.validate` (astraflow/config/streams.py, `ValidateConfig`)."""

    def __init__(
        self, *, check_ids: bool = True, check_key: bool = True, max_tokens: int | None = None
    ) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError("max_tokens must be positive")
        self.check_ids, self.check_key, self.max_tokens = bool(check_ids), bool(check_key), max_tokens

    def __call__(self, raw: bytes | None, key: bytes | None, policies: frozenset[str]) -> Trajectory:
        """Decode and check one Trajectory record. Raises RecordError naming the field."""
        if raw is None:
            raise RecordError("<bytes>", "empty record (null value)")
        return self._check(decode(raw, Trajectory, policies), key)

    def split(self, raw: bytes | None, key: bytes | None, policies: frozenset[str]) -> list[Item]:
        """The trajectories of one record: itself, or each item of a batch, decoded and checked on
        its own. Raises RecordError when the record as a whole is bad (nothing of it is used)."""
        if raw is None:
            raise RecordError("<bytes>", "empty record (null value)")
        record = decode(raw, (Trajectory, TrajectoryBatch), policies)
        if isinstance(record, Trajectory):
            return [(raw, self._check(record, key))]
        self._check_key(key, record.group_id, "TrajectoryBatch")
        return batch_items(record, Trajectory, policies, lambda traj: self._check(traj, None, item=True))

    def _check(self, traj: Trajectory, key: bytes | None, item: bool = False) -> Trajectory:
        """The checks beyond the codec's (a batch's item has no key of its own: the batch's was checked)."""
        if self.check_ids:
            want_group = group_id(traj.task_id, traj.attempt)
            if traj.group_id != want_group:
                raise RecordError(
                    "group_id", f"{traj.group_id!r} is not {want_group!r} (task_id#attempt)", "Trajectory"
                )
            want_traj = traj_id(traj.task_id, traj.attempt, traj.sample_index)
            if traj.traj_id != want_traj:
                raise RecordError(
                    "traj_id",
                    f"{traj.traj_id!r} is not {want_traj!r} (task_id#attempt#sample_index)",
                    "Trajectory",
                )
        if not item:
            self._check_key(key, traj.group_id, "Trajectory")
        if self.max_tokens is not None and len(traj.tokens) > self.max_tokens:
            raise RecordError(
                "tokens", f"{len(traj.tokens)} tokens exceed the limit {self.max_tokens}", "Trajectory"
            )
        return traj

    def _check_key(self, key: bytes | None, gid: str, record_type: str) -> None:
        if not self.check_key:
            return
        got = key.decode("utf-8", "replace") if key is not None else None
        if got != gid:
            raise RecordError("<key>", f"Kafka key {got!r} is not the group_id {gid!r}", record_type)
