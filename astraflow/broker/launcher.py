"""A real single-node Apache Kafka (KRaft combined mode) from Maven Central jars, for machines
without Docker: `astraflow broker start|stop|status`.

The jars are resolved once with Maven into a cache outside the clone (`$ASTRAFLOW_HOME`, default
`~/.cache/astraflow`); `~/.m2` makes later resolutions no-ops. A broker lives in a data directory
that holds its config, its log dirs, its log file and `broker.json` (PID, ports, bootstrap), so
`stop` and `status` find it again from any shell, and a restart on the same directory keeps the data.
The JVM process itself (its flags, storage format, spawn and termination) is handled in jvm.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.broker import classdata, secure
from astraflow.broker.jars import cache_home, ensure_jars, file_lock, find_java, kafka_version
from astraflow.broker.jvm import format_storage, is_our_jvm, spawn_kafka, terminate
from astraflow.errors import BrokerError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

STATE_FILE = "broker.json"


def default_data_dir() -> Path:
    return cache_home() / "broker"


# --------------------------------------------------------------------------------------- state


@dataclass
class BrokerState:
    pid: int
    port: int
    controller_port: int
    bootstrap: str
    data_dir: str
    log_file: str
    cluster_id: str
    started_at: float
    secure: bool = False
    """SASL_SSL with SCRAM-SHA-512 and ACLs (`start(secure=True)`); credentials in `secure/`."""

    @classmethod
    def load(cls, data_dir: Path) -> BrokerState | None:
        path = data_dir / STATE_FILE
        if not path.exists():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            return None

    def save(self) -> None:
        save_state(self, Path(self.data_dir) / STATE_FILE)


def save_state(state: DataclassInstance, path: Path) -> None:
    """A state dataclass (a broker's, a cluster's) as JSON in `path`, replaced whole: a reader never
    sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.replace(path)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------------------- start/stop


def server_properties(
    data_dir: Path,
    port: int,
    controller_port: int,
    node_id: int = 1,
    voters: str | None = None,
    replicas: int = 1,
    passwords: dict[str, str] | None = None,
    listeners: dict[str, str] | None = None,
) -> str:
    """A combined broker+controller node. One node by default; a cluster (astraflow/broker/cluster.py)
    passes each node its id, the static voter set of every node, and `replicas` for the internal
    topics (consumer offsets, transactions, share groups), kept at min ISR replicas - 1. With
    `passwords` (secure mode, one node) the SASL_SSL listener, TLS and ACLs too."""
    min_isr = str(max(1, replicas - 1))
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir / "data"),
        "num.partitions": "1",
        # topics take replication and min.insync.replicas from topics.yaml (a profile); a broker-wide
        # min ISR above a topic's replication would refuse every acks=all write to it
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": "0",
        # Topics come from topics.yaml (or from Faust's own admin calls): a typo must not create one.
        "auto.create.topics.enable": "false",
        "message.max.bytes": str(32 << 20 | 1 << 16),
        "replica.fetch.max.bytes": str(33 << 20),
        "log.cleaner.dedupe.buffer.size": str(32 << 20),
        "log.retention.check.interval.ms": "60000",
        "num.network.threads": "2",
        "num.io.threads": "4",
    }
    if passwords is not None:
        props.update(secure.server_properties(data_dir, port, controller_port, passwords))
    for name, spec in (listeners or {}).items():
        bind, advertised = _listener(name, spec)
        props["listeners"] += f",{name}://{bind}"
        props["advertised.listeners"] += f",{name}://{advertised}"
        props["listener.security.protocol.map"] += f",{name}:PLAINTEXT"
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _listener(name: str, spec: str) -> tuple[str, str]:
    """`BIND_HOST:PORT=ADVERTISED_HOST:PORT` of an extra PLAINTEXT listener (one per region, whose
    clients must be told an address on their side of the link: astraflow.net.regions)."""
    bind, _, advertised = spec.partition("=")
    if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name) or name in ("PLAINTEXT", "CONTROLLER", "SASL_SSL"):
        raise BrokerError(
            f"listener name {name!r}: use upper-case letters, digits and _, not a built-in name"
        )
    if not re.fullmatch(r"[^:=]+:\d+", bind) or not re.fullmatch(r"[^:=]+:\d+", advertised or bind):
        raise BrokerError(f"listener {name}={spec!r}: expected BIND_HOST:PORT[=ADVERTISED_HOST:PORT]")
    return bind, advertised or bind


def _ready(bootstrap: str, timeout: float, data_dir: Path | None = None, is_secure: bool = False) -> bool:
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "socket.timeout.ms": 2000,
        "log_level": 0,
        "logger": SilentLogger(),
    }
    if is_secure and data_dir is not None:
        conf.update(secure_client_config(data_dir, "admin"))
    admin = AdminClient(conf)
    try:
        md = admin.list_topics(timeout=timeout)
        return len(md.brokers) > 0
    except Exception:  # noqa: BLE001 - any failure here means "not ready yet"
        return False


class SilentLogger:
    """librdkafka logs connection refusals loudly while the broker starts; they are expected."""

    def log(self, *args: object, **kwargs: object) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:
        return self.log


def secure_client_config(data_dir: Path, kind: str) -> dict[str, Any]:
    """librdkafka security settings of component kind `kind` for the secured broker of `data_dir`."""
    creds = secure.credentials(data_dir, kind)
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": secure.MECHANISM,
        "sasl.username": creds.username,
        "sasl.password": creds.password,
        "ssl.ca.location": creds.ca_location,
        "ssl.endpoint.identification.algorithm": "https",
    }


def start(
    port: int = 9092,
    data_dir: Path | None = None,
    heap: str = "512m",
    timeout: float = 180.0,
    progress: Callable[[str], None] = lambda _: None,
    die_with_parent: bool = False,
    secured: bool = False,
    listeners: dict[str, str] | None = None,
    on_address: Callable[[str], None] | None = None,
    quick_jit: bool = False,
) -> BrokerState:
    """Start a broker (or return the one already running in `data_dir`). `port=0` picks a free port.
    With `die_with_parent`, the JVM gets SIGTERM if the calling process dies (`astraflow run`).
    With `secured`, the client listener is SASL_SSL (SCRAM-SHA-512) and ACLs are enforced; the CA,
    certificates and credentials are made in `data_dir/secure` (see `astraflow.broker.secure`). A data
    directory formatted one way cannot be started the other way. `listeners` adds PLAINTEXT listeners,
    name -> `BIND_HOST:PORT=ADVERTISED_HOST:PORT`, e.g. one per simulated region. `on_address` is
    called with the bootstrap address once it is chosen, before the JVM boots (a broker already
    running in `data_dir` is returned without it): `astraflow run` starts what is slow to start meanwhile.
    `quick_jit`: the JVM compiles with C1 only, for a broker that lives for one run
    (`astraflow.broker.jvm.jvm_flags`)."""
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(data_dir / ".lock"):
        state = BrokerState.load(data_dir)
        was_secure = (secure.secure_dir(data_dir) / secure.CREDENTIALS).exists()
        if (data_dir / "data" / "meta.properties").exists() and was_secure != secured:
            raise BrokerError(
                f"{data_dir} holds a {'secured' if was_secure else 'PLAINTEXT'} broker; start it "
                f"{'with' if was_secure else 'without'} --secure, or use another data directory"
            )
        if state and is_our_jvm(state.pid, data_dir):
            if _ready(state.bootstrap, 10, data_dir, state.secure):
                return state
            raise BrokerError(
                f"a broker (PID {state.pid}) runs in {data_dir} but does not answer on "
                f"{state.bootstrap}; see {state.log_file} or run `astraflow broker stop`"
            )
        java = find_java()
        libs = ensure_jars(progress)
        if port == 0:
            port = free_port()
        elif not port_is_free(port):
            raise BrokerError(
                f"port {port} on 127.0.0.1 is taken by another process; pick another with --port "
                f"(or --port 0 for any free port)"
            )
        controller_port = (
            state.controller_port if state and port_is_free(state.controller_port) else free_port()
        )
        if controller_port == port:
            controller_port = free_port()
        if on_address is not None:
            on_address(f"127.0.0.1:{port}")
        logs = data_dir / "logs"
        logs.mkdir(exist_ok=True)
        passwords = None
        if secured and listeners:
            raise BrokerError("extra listeners are PLAINTEXT and a secured broker takes none")
        if secured:
            secure.make_certificates(secure.secure_dir(data_dir))
            passwords = secure.ensure_credentials(data_dir)
        props = data_dir / "server.properties"
        # it holds the broker user's password in its JAAS config
        secure.write_private(
            props,
            server_properties(data_dir, port, controller_port, passwords=passwords, listeners=listeners),
        )
        cluster_id = format_storage(java, libs, data_dir, props, state, passwords=passwords)
        log_file = logs / "kafka.log"
        flags = classdata.broker_flags(java, libs, data_dir)
        started = time.time()
        proc = spawn_kafka(java, heap, libs, data_dir, props, logs, die_with_parent, flags, quick_jit)
        state = BrokerState(
            pid=proc.pid,
            port=port,
            controller_port=controller_port,
            bootstrap=f"127.0.0.1:{port}",
            data_dir=str(data_dir),
            log_file=str(log_file),
            cluster_id=cluster_id,
            started_at=started,
            secure=secured,
        )
        state.save()
        (data_dir / "broker.pid").write_text(str(proc.pid))
        progress(
            f"started Kafka {kafka_version()} (PID {proc.pid}), waiting for {state.bootstrap}; "
            f"log: {log_file}"
        )
        deadline = started + timeout
        while time.time() < deadline:
            code = proc.poll()
            if code is not None:
                raise BrokerError(
                    f"the Kafka JVM exited with status {code} during start-up. Log: {log_file}\n"
                    f"{log_tail(log_file)}\n{log_tail(logs / 'kafka.out', 10)}"
                )
            if _ready(state.bootstrap, 2, data_dir, secured):
                return state
            time.sleep(0.3)
        terminate(proc.pid, data_dir, 10)
        raise BrokerError(
            f"Kafka did not answer on {state.bootstrap} within {timeout:.0f}s. Log: {log_file}\n"
            f"{log_tail(log_file)}"
        )


def stop(data_dir: Path | None = None, timeout: float = 30.0) -> BrokerState | None:
    """Stop the broker of `data_dir` gracefully (SIGTERM, then SIGKILL after `timeout`).
    Returns its state, or None if none was running."""
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    state = BrokerState.load(data_dir)
    if state is None:
        return None
    stopped = terminate(state.pid, data_dir, timeout)
    if stopped:
        with contextlib.suppress(Exception):  # a faster next start, never a failed stop
            classdata.adopt(find_java(), ensure_jars(), data_dir)
    with contextlib.suppress(FileNotFoundError):
        (data_dir / "broker.pid").unlink()
    with contextlib.suppress(FileNotFoundError):
        (data_dir / STATE_FILE).unlink()
    return state if stopped else None


def status(data_dir: Path | None = None) -> tuple[BrokerState | None, bool]:
    """(state, answering): the recorded broker of `data_dir` and whether it answers now."""
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    state = BrokerState.load(data_dir)
    if state is None or not is_our_jvm(state.pid, data_dir):
        return None, False
    return state, _ready(state.bootstrap, 5, data_dir, state.secure)


def local_bootstrap(data_dir: Path | None = None) -> str | None:
    """Bootstrap address of the local broker if one is running in `data_dir`."""
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    state = BrokerState.load(data_dir)
    if state is not None and is_our_jvm(state.pid, data_dir):
        return state.bootstrap
    return None


if __name__ == "__main__":  # pragma: no cover - debugging aid
    s = start(port=int(sys.argv[1]) if len(sys.argv) > 1 else 0, progress=print)
    print(s)
