"""A run whose rollout workers sit in a simulated region behind a slow link (astraflow.net.regions):
the broker and trainers in the host namespace, workers in the region's namespace, the region's
Kafka listener and the weight server reached only through the region's link proxy."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow import broker
from astraflow.config import KafkaSettings
from astraflow.net.linkproxy import read_stats
from astraflow.net.regions import Region
from tests.conftest import subprocess_env, worker_cmd
from tests.kafka_helpers import read_topic

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}


def free_port_on(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class WanSite:
    """The broker with a listener for one region, and that region's proxy."""

    region: Region
    bootstrap: str
    """For clients on the host side."""
    kafka_port: int
    """The region's Kafka listener: 127.0.0.1:kafka_port inside the region is the proxy."""
    http_port: int
    """The weight server's port, on the host end of the veth; the proxy's inside the region."""
    stats: Path

    def trainer_settings(self) -> dict[str, Any]:
        """Recipe `trainer:` keys that serve weights to the region (URIs name 127.0.0.1, the proxy there)."""
        return {
            "serve_http": True,
            "http_host": self.region.host_ip,
            "http_port": self.http_port,
            "advertise_host": "127.0.0.1",
        }

    def region_env(self, namespace: str, **extra: str) -> dict[str, str]:
        return subprocess_env(
            ASTRAFLOW_BOOTSTRAP=f"127.0.0.1:{self.kafka_port}",
            ASTRAFLOW_NAMESPACE=namespace,
            ASTRAFLOW_REGION=self.region.name,
            **extra,
        )

    def start_worker(
        self, recipe: Path, run_dir: Path, namespace: str, worker_id: str, log: Path, wan: bool = True
    ) -> Any:
        env = self.region_env(namespace, **({"ASTRAFLOW_WAN": "1"} if wan else {}))
        return self.region.popen(
            worker_cmd(recipe, run_dir, worker_id, "--region", self.region.name),
            env=env,
            log=log,
        )

    def link_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes each way through the proxy, for `kafka` and `weights`."""
        routes = read_stats(self.stats)
        k, w = routes[f"127.0.0.1:{self.kafka_port}"], routes[f"127.0.0.1:{self.http_port}"]
        return {
            "kafka": {"up": k.bytes_up, "down": k.bytes_down, "connections": k.connections},
            "weights": {"up": w.bytes_up, "down": w.bytes_down, "connections": w.connections},
        }


@contextmanager
def wan_site(region: Region, data_dir: Path) -> Iterator[WanSite]:
    """Start a broker whose listener REGION_<NAME> binds the host end of the region's veth and is
    advertised as 127.0.0.1 (the proxy, inside the region), then the region's proxy."""
    kafka_port = free_port_on(region.host_ip)
    http_port = free_port_on(region.host_ip)
    listener = f"REGION_{region.name.upper()}"
    state = broker.start(
        port=0,
        data_dir=data_dir,
        listeners={listener: f"{region.host_ip}:{kafka_port}=127.0.0.1:{kafka_port}"},
    )
    try:
        stats = data_dir / f"link-{region.name}.json"
        proxy = region.start_proxy(
            [kafka_port, http_port], stats, log=data_dir / f"link-{region.name}.log", env=subprocess_env()
        )
        try:
            yield WanSite(region, state.bootstrap, kafka_port, http_port, stats)
        finally:
            region.stop(proxy)
    finally:
        broker.stop(data_dir)


def worker_metrics(run_dir: Path, worker_id: str) -> list[dict[str, Any]]:
    """Metric snapshots the run's collector recorded for one worker."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("component") == "worker" and worker_id in str(r.get("id"))]


def reports_after(
    settings: KafkaSettings, worker_id: str, since: float, timeout: float
) -> list[dict[str, Any]]:
    """A worker's metric reports sent after `since` (wall clock), read from the `metrics` topic itself:
    at least one, unless none came within `timeout`."""

    def mine(records: list[Any]) -> list[dict[str, Any]]:
        return [
            {"time": r.time, "values": r.values}
            for r in records
            if r.component == "worker" and worker_id in r.id and r.time > since
        ]

    return mine(read_topic(settings, "metrics", until=lambda rs: bool(mine(rs)), timeout=timeout))
