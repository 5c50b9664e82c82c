"""AstraFlow: the spine shared by the workers, streams and trainer components.

Everything here is importable without torch: wire records and their codec, the topic spec,
configuration models, Kafka helpers, the local broker launcher and the command line.
"""

from astraflow.errors import AstraFlowError, ConfigError, RecordError

__version__ = "0.1.0"
__all__ = ["AstraFlowError", "ConfigError", "RecordError", "__version__"]
