"""`validate`: the first stage. Bytes from `trajectories` become a checked Trajectory, or an error.

Beyond what the codec checks (types, lengths, finiteness, known policies), a trajectory must be
consistent with the ids the rest of the system relies on: its group_id and traj_id are the ones
`astraflow.records.group_id/traj_id` derive from (task_id, attempt, sample_index), and its Kafka
key is its group_id (the group stage relies on a group's trajectories sharing one partition).
The Faust adapter sends every failure to `deadletter` with topic, partition, offset and reason.
"""

from __future__ import annotations

from astraflow.errors import RecordError
from astraflow.records import Trajectory, decode, group_id, traj_id
from streams.api import Stage


class Validate(Stage):
    kind = "validate"

    def __init__(self, *, check_ids: bool = True, check_key: bool = True, max_tokens: int | None = None) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError("max_tokens must be positive")
        self.check_ids, self.check_key, self.max_tokens = bool(check_ids), bool(check_key), max_tokens

    def __call__(self, raw: bytes | None, key: bytes | None, policies: frozenset[str]) -> Trajectory:
        """Decode and check one record. Raises RecordError naming the field."""
        if raw is None:
            raise RecordError("<bytes>", "empty record (null value)")
        traj = decode(raw, Trajectory, policies)
        if self.check_ids:
            want_group = group_id(traj.task_id, traj.attempt)
            if traj.group_id != want_group:
                raise RecordError("group_id", f"{traj.group_id!r} is not {want_group!r} (task_id#attempt)",
                                  "Trajectory")
            want_traj = traj_id(traj.task_id, traj.attempt, traj.sample_index)
            if traj.traj_id != want_traj:
                raise RecordError("traj_id", f"{traj.traj_id!r} is not {want_traj!r} "
                                  "(task_id#attempt#sample_index)", "Trajectory")
        if self.check_key:
            got = key.decode("utf-8", "replace") if key is not None else None
            if got != traj.group_id:
                raise RecordError("<key>", f"Kafka key {got!r} is not the group_id {traj.group_id!r}",
                                  "Trajectory")
        if self.max_tokens is not None and len(traj.tokens) > self.max_tokens:
            raise RecordError("tokens", f"{len(traj.tokens)} tokens exceed the limit {self.max_tokens}",
                              "Trajectory")
        return traj
