"""Connection settings for Kafka, shared by every component.

They come from the recipe's `kafka:` section, overridden by `ASTRAFLOW_*` environment variables,
so a worker in another region needs only its region's variables (bootstrap, SASL_SSL credentials).
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import Field, field_validator

from astraflow.config.base import StrictModel, validate_model

ENV_PREFIX = "ASTRAFLOW_"
#: environment variable (after the prefix) -> field
ENV_FIELDS = {
    "BOOTSTRAP": "bootstrap",
    "NAMESPACE": "namespace",
    "SECURITY_PROTOCOL": "security_protocol",
    "SASL_MECHANISM": "sasl_mechanism",
    "SASL_USERNAME": "sasl_username",
    "SASL_PASSWORD": "sasl_password",
    "SSL_CA_LOCATION": "ssl_ca_location",
    "SSL_CERTIFICATE_LOCATION": "ssl_certificate_location",
    "SSL_KEY_LOCATION": "ssl_key_location",
    "SSL_VERIFY_HOSTNAME": "ssl_verify_hostname",
    "REGION": "region",
    "CLIENT_ID": "client_id",
    "WAN": "wan",
}


class KafkaSettings(StrictModel):
    """Where the Kafka cluster is and how to authenticate to it."""

    bootstrap: str | None = None
    """Comma-separated host:port list. None means: use (or start) the local broker."""
    namespace: str | None = None
    """Prefix for every topic and consumer group (`<namespace>.tasks`), so several runs can share
    one cluster without seeing each other's data."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """Kafka security protocol; use SASL_SSL across regions."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    """SASL mechanism, when the protocol is SASL_*."""
    sasl_username: str | None = None
    """SASL user name."""
    sasl_password: str | None = Field(default=None, repr=False)
    """SASL password (prefer the ASTRAFLOW_SASL_PASSWORD variable to writing it in a recipe)."""
    ssl_ca_location: str | None = None
    """CA bundle that signed the brokers' certificates."""
    ssl_certificate_location: str | None = None
    """Client certificate, for mutual TLS."""
    ssl_key_location: str | None = None
    """Client private key, for mutual TLS."""
    ssl_verify_hostname: bool = True
    """Check that the broker certificate matches its host name."""
    region: str = "local"
    """Region this process runs in; stamped on trajectories and metrics."""
    client_id: str = "astraflow"
    """Client id reported to the brokers."""
    message_max_bytes: int = Field(default=16 << 20, ge=1 << 20, le=256 << 20)
    """Largest record a producer sends or a consumer fetches; matches topics.yaml."""
    wan: bool = False
    """Tune for a high-latency link: larger batches and fetches, longer timeouts, keepalive."""

    @field_validator("namespace")
    @classmethod
    def _namespace_chars(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9._\-]{1,100}", v):
            raise ValueError("may contain only letters, digits, '.', '_' and '-'")
        return v

    @classmethod
    def from_env(
        cls, base: dict[str, Any] | KafkaSettings | None = None, environ: dict[str, str] | None = None
    ) -> KafkaSettings:
        """Settings from `base` (a recipe section) with ASTRAFLOW_* variables taking precedence."""
        env = os.environ if environ is None else environ
        data = dict(base.model_dump() if isinstance(base, KafkaSettings) else (base or {}))
        for var, name in ENV_FIELDS.items():
            value = env.get(ENV_PREFIX + var)
            if value not in (None, ""):
                data[name] = value
        return validate_model(cls, data, "kafka settings (recipe and ASTRAFLOW_* variables)")

    def topic(self, name: str) -> str:
        """The full topic name for a base name such as `tasks` or `samples.solver`."""
        return f"{self.namespace}.{name}" if self.namespace else name

    def group(self, name: str) -> str:
        """The full consumer group id for a base group name."""
        return f"{self.namespace}.{name}" if self.namespace else name

    def require_bootstrap(self) -> str:
        if not self.bootstrap:
            from astraflow.errors import ConfigError

            raise ConfigError(
                "no Kafka bootstrap servers: set kafka.bootstrap in the recipe or "
                "ASTRAFLOW_BOOTSTRAP, or start the local broker (astraflow broker start)"
            )
        return self.bootstrap
