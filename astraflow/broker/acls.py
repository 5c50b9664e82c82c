"""Least-privilege ACLs for the secured broker: what each component kind may do, and nothing else.

`plan` is a pure function of the run's namespace, policies and group names, read off each
component's code (keep it in step when a component starts reading or writing another topic):

- trainer: reads `samples.<p>` (group `trainer.<p>`), `weights` (lock-step readers, random
  groups `trainer.<p>.lockstep.*`) and `demonstrations.<p>` (its warm-up, random groups
  `trainer.<p>.demonstrations.*`); writes `weights`, `metrics`, `deadletter`.
- streams (Faust): reads `trajectories` (group = its app id); writes `samples.<p>`, `task-stats`,
  `metrics`, `deadletter`, and reads `samples.<p>` back after a crash (groups `streams-readback-*`);
  owns its internal topics (`<app id>-*`: task updates, table changelogs, the assignor's leader
  topic), which it creates itself.
- worker: reads `tasks` (the worker group) and `weights` (groups `weights-reader-*`); writes
  `trajectories`, `metrics`, `deadletter`.
- feeder: writes `tasks` and reads it back when it resumes (the tasks published after its last
  saved position), reads `weights` and `task-stats` (all through groups `feeder-reader-*`) and the
  committed offsets of the worker group (DESCRIBE: it routes tasks to
  the partitions with the least work outstanding); writes `demonstrations.<p>`, `metrics`,
  `deadletter`.
- admin (`astraflow run`, the operator) and the broker are super users: they create topics and
  ACLs and read every group's lag.

Fixed topic names are literal ACLs; only consumer groups with a random suffix and Faust's internal
topics use prefixed ACLs, each on a prefix that only that component uses. The namespace is part
of every name, so a principal of one run's ACLs reaches nothing of another namespace.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from astraflow.config.kafka import KafkaSettings
from astraflow.errors import BrokerError

READ, WRITE, DESCRIBE, ALL = "READ", "WRITE", "DESCRIBE", "ALL"
LITERAL, PREFIXED = "LITERAL", "PREFIXED"


@dataclass(frozen=True, order=True)
class Grant:
    """ALLOW `operation` on a resource to `User:<principal>` from any host."""

    principal: str
    resource: str  # TOPIC or GROUP
    name: str
    pattern: str  # LITERAL or PREFIXED
    operation: str


def plan(
    settings: KafkaSettings,
    policies: list[str],
    streams_app_id: str = "streams",
    worker_group: str = "workers",
) -> list[Grant]:
    """Every grant of every component kind for one namespace (settings.namespace) and its policies."""
    t, g = settings.topic, settings.group
    out: list[Grant] = []

    def topic(who: str, base: str, *ops: str) -> None:
        out.extend(Grant(who, "TOPIC", t(base), LITERAL, op) for op in (*ops, DESCRIBE))

    def group(who: str, name: str, pattern: str = LITERAL) -> None:
        out.append(Grant(who, "GROUP", name, pattern, READ))

    samples = [f"samples.{p}" for p in policies]
    for who in ("trainer", "streams", "worker", "feeder"):
        for base in ("metrics", "deadletter"):
            topic(who, base, WRITE)
    # trainer
    for s in samples:
        topic("trainer", s, READ)
    topic("trainer", "weights", READ, WRITE)
    for p in policies:
        topic("trainer", f"demonstrations.{p}", READ)
        group("trainer", g(f"trainer.{p}"))
        group("trainer", g(f"trainer.{p}.lockstep."), PREFIXED)
        group("trainer", g(f"trainer.{p}.demonstrations."), PREFIXED)
    # streams
    topic("streams", "trajectories", READ)
    for s in samples:
        topic("streams", s, READ, WRITE)
    topic("streams", "task-stats", WRITE)
    app_id = g(streams_app_id)
    out.append(Grant("streams", "TOPIC", f"{app_id}-", PREFIXED, ALL))
    group("streams", app_id)
    group("streams", g("streams-readback-"), PREFIXED)
    # worker
    topic("worker", "tasks", READ)
    topic("worker", "weights", READ)
    topic("worker", "trajectories", WRITE)
    group("worker", g(worker_group))
    group("worker", g("weights-reader-"), PREFIXED)
    # feeder
    topic("feeder", "tasks", WRITE, READ)  # READ: a restarted feeder finds what it published unsaved
    topic("feeder", "weights", READ)
    topic("feeder", "task-stats", READ)
    for p in policies:
        topic("feeder", f"demonstrations.{p}", WRITE)
    group("feeder", g("feeder-reader-"), PREFIXED)
    out.append(Grant("feeder", "GROUP", g(worker_group), LITERAL, DESCRIBE))  # committed offsets only
    return sorted(set(out))


def bindings(grants: list[Grant]) -> list[Any]:
    """confluent-kafka AclBindings (ALLOW, any host) for `grants`."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return [
        AclBinding(
            ResourceType[x.resource],
            x.name,
            ResourcePatternType[x.pattern],
            f"User:{x.principal}",
            "*",
            AclOperation[x.operation],
            AclPermissionType.ALLOW,
        )
        for x in grants
    ]


def apply(admin: Any, grants: list[Grant], timeout: float = 30.0) -> int:
    """Create the ACLs with `admin` (a super user's AdminClient); idempotent. Returns how many."""
    futures = admin.create_acls(bindings(grants), request_timeout=timeout)
    errors = []
    for binding, fut in futures.items():
        try:
            fut.result()
        except Exception as exc:  # noqa: BLE001 - collected and raised together below
            errors.append(f"{binding}: {exc}")
    if errors:
        raise BrokerError(f"{len(errors)} ACL(s) could not be created: " + "; ".join(errors[:3]))
    _wait_visible(admin, set(futures), timeout)
    return len(grants)


def _wait_visible(admin: Any, wanted: set[Any], timeout: float) -> None:
    """Wait until the broker's authorizer holds every binding. CreateAcls returns once the controller
    committed them; the broker applies them when its metadata catches up (seconds later on a busy
    machine), and a client refused in between caches the refusal: components start only after this."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    # None matches any name, principal and host (the stubs say str)
    anything: Any = None
    every = AclBindingFilter(
        ResourceType.ANY,
        anything,
        ResourcePatternType.ANY,
        anything,
        anything,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    deadline = time.monotonic() + timeout
    missing = wanted
    while time.monotonic() < deadline:
        missing = wanted - set(admin.describe_acls(every, request_timeout=timeout).result())
        if not missing:
            return
        time.sleep(0.5)
    raise BrokerError(
        f"{len(missing)} ACL(s) created but not applied by the broker within {timeout:.0f}s, "
        f"e.g. {next(iter(missing))}"
    )
