"""Reading topics back in the workers' broker tests: the shared helpers of tests/kafka_helpers.py."""

from tests.kafka_helpers import committed, committed_tokens, end_offsets, read_topic, read_trajectories

__all__ = ["committed", "committed_tokens", "end_offsets", "read_topic", "read_trajectories"]
