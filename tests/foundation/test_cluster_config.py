"""The 3-node cluster's node configs and recorded state, without starting a JVM (the cluster itself
runs in tests/e2e/test_cluster.py)."""

from __future__ import annotations

from pathlib import Path

from astraflow.broker import cluster
from astraflow.broker.launcher import server_properties


def props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_each_node_is_a_voter_of_one_quorum_and_internal_topics_keep_two_in_sync(tmp_path: Path) -> None:
    voters = "1@127.0.0.1:7001,2@127.0.0.1:7002,3@127.0.0.1:7003"
    node = props(server_properties(tmp_path / "node-2", 9093, 7002, node_id=2, voters=voters, replicas=3))
    assert node["node.id"] == "2" and node["process.roles"] == "broker,controller"
    assert node["controller.quorum.voters"] == voters
    assert node["listeners"] == "PLAINTEXT://127.0.0.1:9093,CONTROLLER://127.0.0.1:7002"
    assert node["log.dirs"] == str(tmp_path / "node-2" / "data")
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "share.coordinator.state.topic.replication.factor",
    ):
        assert node[key] == "3", key
    assert node["transaction.state.log.min.isr"] == node["share.coordinator.state.topic.min.isr"] == "2"
    # topics bring their own min ISR (topics.yaml profile): a broker default of 2 would refuse RF-1 topics
    assert node["min.insync.replicas"] == "1" and node["default.replication.factor"] == "1"

    single = props(server_properties(tmp_path, 9092, 7000))  # the one-node broker is unchanged
    assert single["controller.quorum.voters"] == "1@127.0.0.1:7000"
    assert (
        single["offsets.topic.replication.factor"] == "1" and single["transaction.state.log.min.isr"] == "1"
    )


def test_cluster_state_round_trips_and_names_every_node(tmp_path: Path) -> None:
    state = cluster.ClusterState(str(tmp_path), "abc", [9092, 9093, 9094], [7001, 7002, 7003], [0, 0, 0])
    state.save()
    assert cluster.is_cluster(tmp_path)
    loaded = cluster.ClusterState.load(tmp_path)
    assert loaded == state
    assert loaded.bootstrap == "127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094"
    assert loaded.node_dir(2) == tmp_path / "node-3"
    assert cluster.alive(loaded) == [False, False, False]  # PID 0 is no Kafka JVM of ours
    assert cluster.status(tmp_path)[1:] == ([False, False, False], 0)
    assert cluster.stop(tmp_path) is None  # nothing was running
