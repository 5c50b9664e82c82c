"""Wire records and their msgpack codec: the contract between every component.

from astraflow.records import Trajectory, encode, decode
data = encode(traj)                     # validates, then packs
traj = decode(data, Trajectory)         # unpacks, then validates; only RecordError escapes
"""

from astraflow.errors import RecordError
from astraflow.records.base import Record
from astraflow.records.codec import (
    SCHEMA_VERSION,
    batch_items,
    batches,
    decode,
    encode,
    sample_batches,
    samples_of,
    trajectories_of,
)
from astraflow.records.types import (
    DTYPES,
    FINISH_REASONS,
    RECORD_TYPES,
    DeadLetter,
    Demonstration,
    Metric,
    Sample,
    SampleBatch,
    Task,
    TaskStats,
    Trajectory,
    TrajectoryBatch,
    WeightVersion,
    group_id,
    traj_id,
)

__all__ = [
    "DTYPES",
    "FINISH_REASONS",
    "RECORD_TYPES",
    "SCHEMA_VERSION",
    "DeadLetter",
    "Demonstration",
    "Metric",
    "Record",
    "RecordError",
    "Sample",
    "SampleBatch",
    "Task",
    "TaskStats",
    "Trajectory",
    "TrajectoryBatch",
    "WeightVersion",
    "batch_items",
    "batches",
    "decode",
    "encode",
    "group_id",
    "sample_batches",
    "samples_of",
    "traj_id",
    "trajectories_of",
]
