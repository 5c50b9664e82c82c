"""The one root exception type of the project and its few well-known children.

Components let errors propagate and catch them only at their boundary (a record that fails to
decode goes to `deadletter`); these types let that boundary tell bad data from bugs.
"""

from __future__ import annotations


class AstraFlowError(Exception):
    """Root of every error AstraFlow raises on purpose."""


class ConfigError(AstraFlowError):
    """A recipe, topic spec or setting is wrong. The message names the key and the file."""


class RecordError(AstraFlowError):
    """A wire record is malformed. `field` names the offending field (dotted for nested ones)."""

    def __init__(self, field: str, reason: str, record_type: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.record_type = record_type
        where = f"{record_type}.{field}" if record_type else field
        super().__init__(f"{where}: {reason}")


class BrokerError(AstraFlowError):
    """The local Kafka broker could not be started, reached or stopped."""
