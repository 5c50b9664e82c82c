"""A local Kafka cluster of N KRaft nodes: `astraflow broker start --nodes 3`.

Each node is a combined broker+controller JVM (small heap) in `<data dir>/node-<id>/`, laid out as
the single broker of launcher.py is. The controllers form a static quorum of N voters
(`controller.quorum.voters` lists every node, so every node's storage is formatted with the same
cluster id and without `--standalone`): with 3 nodes the cluster keeps a controller majority and
2 in-sync replicas when any one node dies. `cluster.json` records the ports, PIDs and cluster id,
so `stop` and `status` find every node from any shell, and `start` on the same directory restarts
only the nodes that are down (a broker killed by a test comes back with its data and ports).

Topics get their replication from topics.yaml, e.g. `astraflow topics apply --profile replicated`
(3 replicas, min.insync.replicas 2); the internal topics (consumer offsets, transactions) get N
replicas here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.broker import jvm
from astraflow.broker import launcher as one
from astraflow.errors import BrokerError

CLUSTER_FILE = "cluster.json"


def default_cluster_dir() -> Path:
    return one.cache_home() / "cluster"


def is_cluster(data_dir: Path) -> bool:
    return (data_dir.expanduser() / CLUSTER_FILE).exists()


@dataclass
class ClusterState:
    data_dir: str
    cluster_id: str
    ports: list[int]
    controller_ports: list[int]
    pids: list[int]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def node_dir(self, index: int) -> Path:
        return Path(self.data_dir) / f"node-{index + 1}"

    @classmethod
    def load(cls, data_dir: Path) -> ClusterState | None:
        try:
            return cls(**json.loads((data_dir / CLUSTER_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save(self) -> None:
        one.save_state(self, Path(self.data_dir) / CLUSTER_FILE)


def alive(state: ClusterState) -> list[bool]:
    """Whether each node's JVM runs (PID-reuse safe)."""
    return [jvm.is_our_jvm(pid, state.node_dir(i)) for i, pid in enumerate(state.pids)]


def brokers_answering(bootstrap: str, timeout: float) -> int:
    """How many brokers the cluster metadata lists (0 if nothing answers)."""
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "socket.timeout.ms": 2000,
        "log_level": 0,
        "logger": one.SilentLogger(),
    }
    admin = AdminClient(conf)
    try:
        return len(admin.list_topics(timeout=timeout).brokers)
    except Exception:  # noqa: BLE001 - any failure here means "not ready yet"
        return 0


def _ports(nodes: int, first_port: int) -> list[int]:
    if first_port == 0:
        return [one.free_port() for _ in range(nodes)]
    ports = list(range(first_port, first_port + nodes))
    taken = [p for p in ports if not one.port_is_free(p)]
    if taken:
        raise BrokerError(
            f"ports {taken} on 127.0.0.1 are taken; pick another --port (or --port 0 for free ports)"
        )
    return ports


def start(
    nodes: int = 3,
    port: int = 0,
    data_dir: Path | None = None,
    heap: str = "256m",
    timeout: float = 240.0,
    progress: Callable[[str], None] = lambda _: None,
    die_with_parent: bool = False,
) -> ClusterState:
    """Start the cluster in `data_dir` (or the nodes of it that are down) and wait until every
    node is a live broker. `port` is the first node's client port (0: free ports)."""
    if nodes < 1:
        raise BrokerError("a cluster needs at least one node")
    data_dir = (data_dir or default_cluster_dir()).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with one.file_lock(data_dir / ".lock"):
        state = ClusterState.load(data_dir)
        if state is not None and len(state.ports) != nodes:
            raise BrokerError(
                f"{data_dir} holds a cluster of {len(state.ports)} nodes, not {nodes}; "
                "stop it and use another --data-dir"
            )
        java, libs = one.find_java(), one.ensure_jars(progress)
        if state is None:
            state = ClusterState(
                str(data_dir),
                jvm.new_cluster_id(),
                _ports(nodes, port),
                [one.free_port() for _ in range(nodes)],
                [0] * nodes,
            )
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, c in enumerate(state.controller_ports))
        down = [i for i, running in enumerate(alive(state)) if not running]
        with ThreadPoolExecutor(
            max(1, len(down))
        ) as pool:  # each start formats first: one JVM each, in parallel
            started = pool.map(
                lambda i: _start_node(state, i, voters, java, libs, heap, die_with_parent), down
            )
            procs = dict(zip(down, started, strict=True))
        for i, proc in procs.items():
            state.pids[i] = proc.pid
        state.save()
        progress(
            f"Kafka {one.kafka_version()} cluster of {nodes} nodes, waiting for {state.bootstrap}; "
            f"logs: {data_dir}/node-*/logs/kafka.log"
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            for i, proc in procs.items():
                code = proc.poll()
                if code is not None:
                    log = state.node_dir(i) / "logs" / "kafka.log"
                    stop(data_dir)
                    raise BrokerError(
                        f"the Kafka JVM of node {i + 1} exited with status {code} during start-up. "
                        f"Log: {log}\n{one.log_tail(log)}"
                    )
            if brokers_answering(state.bootstrap, 2) == nodes:
                return state
            time.sleep(0.5)
        stop(data_dir)
        raise BrokerError(
            f"the cluster did not show {nodes} brokers on {state.bootstrap} within {timeout:.0f}s; "
            f"see {data_dir}/node-*/logs/kafka.log"
        )


def _start_node(
    state: ClusterState, i: int, voters: str, java: str, libs: Path, heap: str, die_with_parent: bool
) -> subprocess.Popen[bytes]:
    node = state.node_dir(i)
    port, controller_port = state.ports[i], state.controller_ports[i]
    for p in (port, controller_port):
        if not one.port_is_free(p):
            raise BrokerError(f"node {i + 1}: port {p} on 127.0.0.1 is taken by another process")
    logs = node / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    props = node / "server.properties"
    props.write_text(
        one.server_properties(
            node, port, controller_port, node_id=i + 1, voters=voters, replicas=min(3, len(state.ports))
        )
    )
    jvm.format_storage(java, libs, node, props, None, cluster_id=state.cluster_id)
    proc = jvm.spawn_kafka(java, heap, libs, node, props, logs, die_with_parent)
    one.BrokerState(
        pid=proc.pid,
        port=port,
        controller_port=controller_port,
        bootstrap=f"127.0.0.1:{port}",
        data_dir=str(node),
        log_file=str(logs / "kafka.log"),
        cluster_id=state.cluster_id,
        started_at=time.time(),
    ).save()
    return proc


def stop(data_dir: Path | None = None, timeout: float = 30.0) -> ClusterState | None:
    """SIGTERM every node at once (one by one, the last ones would wait for a lost quorum), wait,
    then SIGKILL what is left. Returns the state, or None if no node was running."""
    data_dir = (data_dir or default_cluster_dir()).expanduser().resolve()
    state = ClusterState.load(data_dir)
    if state is None:
        return None
    running = [i for i, up in enumerate(alive(state)) if up]
    for i in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.pids[i], signal.SIGTERM)
    deadline = time.time() + timeout
    while time.time() < deadline and any(alive(state)):
        for pid in state.pids:
            jvm.reap(pid)
        time.sleep(0.2)
    for i, up in enumerate(alive(state)):
        if up:
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.pids[i], signal.SIGKILL)
    for _ in range(50):
        for pid in state.pids:
            jvm.reap(pid)
        if not any(alive(state)):
            break
        time.sleep(0.1)
    for i in range(len(state.pids)):
        with contextlib.suppress(FileNotFoundError):
            (state.node_dir(i) / one.STATE_FILE).unlink()
    return state if running else None


def status(data_dir: Path | None = None) -> tuple[ClusterState | None, list[bool], int]:
    """(state, which nodes run, how many brokers the metadata lists)."""
    data_dir = (data_dir or default_cluster_dir()).expanduser().resolve()
    state = ClusterState.load(data_dir)
    if state is None:
        return None, [], 0
    up = alive(state)
    return state, up, brokers_answering(state.bootstrap, 5) if any(up) else 0


def describe(state: ClusterState) -> dict[str, Any]:
    """What `status` prints: bootstrap and each node's PID and whether it runs."""
    return {
        "bootstrap": state.bootstrap,
        "nodes": [
            {"node": i + 1, "port": p, "pid": pid, "running": up}
            for i, (p, pid, up) in enumerate(zip(state.ports, state.pids, alive(state), strict=True))
        ],
    }
