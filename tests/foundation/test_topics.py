"""topics.yaml: validation of the spec, template expansion, and convergence on a real broker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from astraflow import topics
from astraflow.config import KafkaSettings
from astraflow.errors import ConfigError
from astraflow.kafka import make_admin

DESIGN_TOPICS = {
    "tasks",
    "trajectories",
    "samples.{policy}",
    "weights",
    "task-stats",
    "metrics",
    "deadletter",
    "demonstrations.{policy}",
}


def test_spec_has_every_topic_of_the_design() -> None:
    spec = topics.load_spec()
    assert set(spec.topics) == DESIGN_TOPICS == set(topics.BASE_NAMES)  # the code's names are the file's
    assert topics.samples("solver") == "samples.solver"
    assert topics.demonstrations("solver") == "demonstrations.solver"
    for compacted in ("weights", "task-stats", "demonstrations.{policy}"):
        assert spec.topics[compacted].cleanup == "compact"
    specs = topics.expand(spec, ["solver", "verifier"])
    names = {s.name for s in specs}
    assert {"samples.solver", "samples.verifier"} <= names
    dead = topics.find(specs, "deadletter")
    biggest = max(int(s.configs["max.message.bytes"]) for s in specs if s.base != "deadletter")
    assert int(dead.configs["max.message.bytes"]) > biggest  # a dead letter carries the raw record


def test_namespace_prefixes_every_topic() -> None:
    specs = topics.expand(topics.load_spec(), ["p"], KafkaSettings(namespace="run1"))
    assert all(s.name.startswith("run1.") for s in specs)


def test_templates_need_policies() -> None:
    with pytest.raises(ConfigError, match="needs policies"):
        topics.expand(topics.load_spec(), None)


def test_the_replicated_profile_puts_every_topic_on_3_brokers_with_2_in_sync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ASTRAFLOW_TOPICS_PROFILE", raising=False)
    spec = topics.load_spec()
    plain = topics.expand(spec, ["p"])
    assert {s.replication for s in plain} == {1} and all(
        "min.insync.replicas" not in s.configs for s in plain
    )
    replicated = topics.expand(spec, ["p"], profile="replicated")
    assert [s.name for s in replicated] == [s.name for s in plain]
    for before, after in zip(plain, replicated, strict=True):
        assert after.replication == 3 and after.configs["min.insync.replicas"] == "2"
        assert after.partitions == before.partitions  # only the copies change
        assert {k: v for k, v in after.configs.items() if k != "min.insync.replicas"} == before.configs
    monkeypatch.setenv("ASTRAFLOW_TOPICS_PROFILE", "replicated")  # what `astraflow run` applies
    assert topics.expand(spec, ["p"]) == replicated


def test_profile_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="unknown topic profile 'replicatd'; topics.yaml defines: replicated"
    ):
        topics.expand(topics.load_spec(), ["p"], profile="replicatd")
    bad = spec_file(
        tmp_path, lambda d: d["profiles"].update(odd={"replication": 2, "min_insync_replicas": 3})
    )
    with pytest.raises(ConfigError, match="min_insync_replicas 3 exceeds its replication 2"):
        topics.expand(topics.load_spec(bad), ["p"], profile="odd")
    typo = spec_file(tmp_path, lambda d: d["profiles"]["replicated"].update(min_isr=2))
    with pytest.raises(ConfigError, match="profiles.replicated.min_isr"):
        topics.load_spec(typo)


def spec_file(tmp_path: Path, mutate: Callable[[dict[str, Any]], object]) -> Path:
    data = yaml.safe_load(topics.DEFAULT_SPEC.read_text())
    mutate(data)
    path = tmp_path / "topics.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda d: d["topics"]["tasks"].update(partitons=3), "unknown key 'topics.tasks.partitons'"),
        (lambda d: d["topics"]["tasks"].update(partitions=0), "topics.tasks.partitions"),
        (lambda d: d["topics"]["tasks"].update(record="Tsak"), "unknown record type 'Tsak'"),
        (lambda d: d["topics"]["tasks"].update(cleanup="shred"), "topics.tasks.cleanup"),
        (lambda d: d["topics"].update({"x.{region}": {"record": "Task"}}), "unknown placeholder {region}"),
        (lambda d: d["topics"].update({"bad topic!": {"record": "Task"}}), "not a legal topic name"),
        (lambda d: d["defaults"].update(replication="three"), "defaults.replication"),
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.pop("topics"), "missing required key 'topics'"),
    ],
)
def test_malformed_spec_is_refused_naming_the_key(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], object], words: str
) -> None:
    path = spec_file(tmp_path, mutate)
    with pytest.raises(ConfigError) as info:
        topics.load_spec(path)
    assert words in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.broker
def test_apply_creates_grows_converges_and_is_idempotent(kafka: KafkaSettings, tmp_path: Path) -> None:
    admin = make_admin(kafka)
    specs = topics.expand(topics.load_spec(), ["a", "b"], kafka)
    first = topics.apply(admin, specs)
    assert sorted(first.created) == sorted(s.name for s in specs)
    md = admin.list_topics(timeout=10)
    for s in specs:
        assert len(md.topics[s.name].partitions) == s.partitions

    again = topics.apply(admin, specs)
    assert not again.changed and sorted(again.unchanged) == sorted(s.name for s in specs)

    def grow(d: dict) -> None:
        d["topics"]["tasks"]["partitions"] = 12
        d["topics"]["metrics"]["retention_ms"] = 3_600_000
        d["topics"]["trajectories"]["partitions"] = 2  # fewer than exist: cannot shrink, warn

    changed = topics.expand(topics.load_spec(spec_file(tmp_path, grow)), ["a", "b"], kafka)
    report = topics.apply(admin, changed)
    assert report.grown == [(kafka.topic("tasks"), 8, 12)]
    assert report.reconfigured == [(kafka.topic("metrics"), {"retention.ms": "3600000"})]
    assert any("cannot shrink" in w for w in report.warnings)
    assert len(admin.list_topics(timeout=10).topics[kafka.topic("tasks")].partitions) == 12
    assert not topics.apply(admin, changed).changed


@pytest.mark.broker
def test_replication_beyond_the_cluster_is_refused(kafka: KafkaSettings, tmp_path: Path) -> None:
    path = spec_file(tmp_path, lambda d: d["defaults"].update(replication=3))
    with pytest.raises(ConfigError, match="replication 3 exceeds the 1 broker"):
        topics.apply(make_admin(kafka), topics.expand(topics.load_spec(path), ["a"], kafka))
