"""`astraflow broker start --secure` against a real broker of its own: SASL_SSL with SCRAM-SHA-512,
a CA it made, ACLs per component kind. Clients without credentials, with a wrong password, or
reaching past their principal's ACLs are refused, each with its specific error. A recipe trained on a
secured broker: test_secure_run.py."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astraflow import topics as topic_spec
from astraflow.broker import acls, launcher, secure
from astraflow.config import KafkaSettings
from astraflow.kafka import KafkaReadError, TopicReader, client_config, make_admin
from tests.conftest import REPO, subprocess_env
from tests.kafka_helpers import commit, settings_of

pytestmark = [pytest.mark.broker, pytest.mark.slow]

POLICIES = ["solver"]


class _Quiet:
    """Collects librdkafka log lines instead of printing them (refusals are noisy by design)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, *args: object, **kwargs: object) -> None:
        self.lines.append(" ".join(str(a) for a in args))

    def __getattr__(self, name: str) -> Any:
        return self.log


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[launcher.BrokerState]:
    data_dir = tmp_path_factory.mktemp("secure-kafka")
    state = launcher.start(port=0, data_dir=data_dir, secured=True)
    try:
        yield state
    finally:
        launcher.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def namespace(secured: launcher.BrokerState) -> str:
    """A namespace with the topics of topics.yaml and the ACLs of every component kind."""
    ns = f"s{uuid.uuid4().hex[:8]}"
    admin_settings = settings_of(secured, "admin", ns)
    admin = make_admin(admin_settings)
    topic_spec.apply(admin, topic_spec.expand(topic_spec.load_spec(), POLICIES, admin_settings))
    acls.apply(admin, acls.plan(admin_settings, POLICIES))
    return ns


def errors_of(conf: dict[str, Any], quiet: _Quiet | None = None) -> tuple[dict[str, Any], list[Any]]:
    """`conf` with an error callback and a quiet logger; the list fills with the KafkaErrors seen
    (served by the client's poll)."""
    seen: list[Any] = []
    return {**conf, "error_cb": seen.append, "logger": quiet or _Quiet(), "socket.timeout.ms": 3000}, seen


def test_credentials_and_keys_are_private_and_the_listener_is_sasl_ssl_only(
    secured: launcher.BrokerState,
) -> None:
    sdir = Path(secured.data_dir) / "secure"
    for name in ("credentials.json", "ca.key", "broker.pem"):
        assert stat.S_IMODE((sdir / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((Path(secured.data_dir) / "server.properties").stat().st_mode) == 0o600
    props = (Path(secured.data_dir) / "server.properties").read_text()
    assert f"advertised.listeners=SASL_SSL://127.0.0.1:{secured.port}\n" in props
    assert "PLAINTEXT://" not in props.split("listeners=")[1].splitlines()[0]
    assert "allow.everyone.if.no.acl.found=false" in props
    passwords = {k: secure.credentials(Path(secured.data_dir), k).password for k in secure.KINDS}
    assert len(set(passwords.values())) == len(secure.KINDS)  # one secret per principal


def test_the_admin_principal_with_the_ca_gets_in(secured: launcher.BrokerState) -> None:
    md = make_admin(settings_of(secured, "admin")).list_topics(timeout=30)
    assert list(md.brokers) == [1]


def test_a_client_without_credentials_is_refused(secured: launcher.BrokerState) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    # no TLS at all: the TLS listener hangs up on the first request; TLS with the right CA but no
    # SASL: the handshake succeeds and the broker hangs up on the first unauthenticated request
    for proto, why in (
        ("PLAINTEXT", "connection closed by peer: receive 0 after POLLIN (after"),
        ("SSL", "SSL connection closed by peer"),
    ):
        conf = {"bootstrap.servers": secured.bootstrap, "security.protocol": proto}
        if proto == "SSL":
            conf["ssl.ca.location"] = secure.credentials(Path(secured.data_dir), "admin").ca_location
        quiet = _Quiet()
        conf, seen = errors_of(conf, quiet)
        admin = AdminClient(conf)
        with pytest.raises(KafkaException) as info:
            admin.list_topics(timeout=8)
        assert info.value.args[0].code() == KafkaError._TRANSPORT, (proto, info.value)
        admin.poll(1)
        assert {e.code() for e in seen} == {KafkaError._ALL_BROKERS_DOWN}, (proto, seen)
        assert any(why in line for line in quiet.lines), (proto, quiet.lines[:3])


def test_a_wrong_password_is_refused_as_an_authentication_failure(secured: launcher.BrokerState) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    conf = client_config(settings_of(secured, "worker").model_copy(update={"sasl_password": "guess"}))
    conf, seen = errors_of(conf)
    admin = AdminClient(conf)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=8)
    admin.poll(1)
    auth = [e for e in seen if e.code() == KafkaError._AUTHENTICATION]
    assert auth, seen
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in auth[0].str()


def test_the_acl_plan_is_least_privilege() -> None:
    grants = acls.plan(KafkaSettings(bootstrap="x:1", namespace="ns"), ["a", "b"])
    by = {(g.principal, g.resource, g.name, g.operation) for g in grants}
    # the worker reads tasks and writes trajectories; it never writes weights or reads samples
    assert ("worker", "TOPIC", "ns.tasks", "READ") in by
    assert ("worker", "TOPIC", "ns.trajectories", "WRITE") in by
    assert not {x for x in by if x[0] == "worker" and x[2] in ("ns.weights", "ns.tasks") and x[3] == "WRITE"}
    assert not {x for x in by if x[0] == "worker" and x[2].startswith("ns.samples.")}
    # only the trainer writes weights; only the feeder writes tasks
    assert {x[0] for x in by if x[2] == "ns.weights" and x[3] == "WRITE"} == {"trainer"}
    assert {x[0] for x in by if x[2] == "ns.tasks" and x[3] == "WRITE"} == {"feeder"}
    assert ("feeder", "TOPIC", "ns.tasks", "READ") in by  # a restarted feeder reads back what it published
    # the feeder writes the warm-up's demonstrations, the trainer only reads them
    for p in ("a", "b"):
        assert {(x[0], x[3]) for x in by if x[2] == f"ns.demonstrations.{p}"} == {
            ("feeder", "WRITE"),
            ("feeder", "DESCRIBE"),
            ("trainer", "READ"),
            ("trainer", "DESCRIBE"),
        }
    # prefixed grants only where names carry a random suffix or belong to Faust
    prefixed = sorted((g.principal, g.name) for g in grants if g.pattern == "PREFIXED")
    assert prefixed == [
        ("feeder", "ns.feeder-reader-"),
        ("streams", "ns.streams-"),
        ("streams", "ns.streams-readback-"),
        ("trainer", "ns.trainer.a.demonstrations."),
        ("trainer", "ns.trainer.a.lockstep."),
        ("trainer", "ns.trainer.b.demonstrations."),
        ("trainer", "ns.trainer.b.lockstep."),
        ("worker", "ns.weights-reader-"),
    ]
    assert all(g.name.startswith("ns.") for g in grants)  # nothing outside the namespace
    # the feeder reads the workers' committed offsets (routing), but may not join or commit there
    assert {x[3] for x in by if x[0] == "feeder" and x[2] == "ns.workers"} == {"DESCRIBE"}
    assert "ALL" not in {g.operation for g in grants if g.principal != "streams"}


def _produce(settings: KafkaSettings, topic: str) -> Any:
    """Produce one keyed record (`weights` is compacted) to the base topic; the delivery error (None
    if acknowledged)."""
    from confluent_kafka import Producer

    result: list[Any] = []
    conf, _ = errors_of(client_config(settings))
    producer = Producer({**conf, "enable.idempotence": True, "acks": "all", "message.timeout.ms": 15000})
    producer.produce(settings.topic(topic), b"x", key=b"k", on_delivery=lambda err, _m: result.append(err))
    producer.flush(30)
    return result[0] if result else "no delivery report"


def test_a_principal_may_write_its_own_topics_but_not_others(
    secured: launcher.BrokerState, namespace: str
) -> None:
    from confluent_kafka import KafkaError

    worker = settings_of(secured, "worker", namespace)
    assert _produce(worker, "trajectories") is None
    err = _produce(worker, "weights")  # choosing the weights is the trainer's alone
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    assert _produce(settings_of(secured, "trainer", namespace), "weights") is None


def _consume_error(settings: KafkaSettings, group: str, topic: str) -> str | None:
    """What a reader in `group` subscribed to `topic` is refused with: the error's name (None if
    it is assigned). TopicReader raises the refusal; the error callback may hear it first."""
    conf, seen = errors_of({"session.timeout.ms": 6000})
    assigned = threading.Event()
    with TopicReader(settings, [topic], group=group, **conf) as reader:
        reader.subscribe(on_assign=lambda _c, parts: parts and assigned.set())
        for _ in range(40):
            try:
                reader.poll(0.5)
            except KafkaReadError as exc:
                return str(exc)
            if seen:
                return str(seen[0].name())
            if assigned.is_set():
                return None
        return "neither an assignment nor an error"


def test_a_principal_may_not_read_a_topic_or_join_a_group_it_was_not_granted(
    secured: launcher.BrokerState, namespace: str
) -> None:
    from confluent_kafka import KafkaError

    worker = settings_of(secured, "worker", namespace)
    assert _consume_error(worker, "workers", "tasks") is None  # its own group and topic
    err = _consume_error(worker, "workers", "samples.solver")  # the trainer's input
    assert err is not None and "TOPIC_AUTHORIZATION_FAILED" in err, err
    err = _consume_error(worker, "trainer.solver", "tasks")  # the trainer's group
    assert err is not None and "GROUP_AUTHORIZATION_FAILED" in err, err
    # another namespace is another run: nothing granted there
    other = settings_of(secured, "worker", namespace + "x")
    err2 = _produce(other, "trajectories")
    assert err2 is not None and err2.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err2


def test_the_feeder_reads_the_worker_groups_progress_but_may_not_move_it(
    secured: launcher.BrokerState, namespace: str
) -> None:
    from confluent_kafka import KafkaException

    from workers.routing import LeastOutstanding, LoadProbe

    commit(settings_of(secured, "worker", namespace), "workers", "tasks", dict.fromkeys(range(8), 0))
    feeder = settings_of(secured, "feeder", namespace)
    probe, routing = LoadProbe(feeder, "workers", refresh_s=0.1), LeastOutstanding()
    try:
        probe.refresh(routing)
    finally:
        probe.close()
    assert probe.failures == 0 and routing.done == dict.fromkeys(range(8), 0), routing.done
    with pytest.raises(KafkaException, match="GROUP_AUTHORIZATION_FAILED"):
        commit(feeder, "workers", "tasks", {0: 1})


def test_a_restarted_feeder_may_read_back_the_tasks_it_published(
    secured: launcher.BrokerState, namespace: str
) -> None:
    """Feeder._resume reads `tasks` from the end offsets of its last saved position, through a group
    of its own prefix: the tasks published after the save are not published again. Before, the feeder
    principal could not read `tasks` and a restarted feeder on a secured broker failed there."""
    from astraflow.kafka import Publisher
    from astraflow.records import Task, encode
    from workers.feeder_state import published_since

    feeder = settings_of(secured, "feeder", namespace)
    task = Task(task_id="t", env="arithmetic", roles={"solver": "p"}, group_size=2, prompt="1+1=", seed=0)
    publisher = Publisher(feeder)
    publisher.send_raw("tasks", encode(task), task.group_id)
    publisher.flush(30)
    with TopicReader(feeder, group="feeder-reader-resume-test", **{"enable.auto.commit": False}) as reader:
        seen = published_since(reader, feeder.topic("tasks"), {}, reader.end_offsets(feeder.topic("tasks")))
    assert seen == {task.group_id}


def test_a_reader_denied_by_an_acl_raises_at_once_naming_the_topic(
    secured: launcher.BrokerState, namespace: str
) -> None:
    """A trainer-style reader (partitions assigned, no group join) of a topic its principal may
    not read stops with the refusal instead of polling nothing for ever."""
    worker = settings_of(secured, "worker", namespace)
    conf, _ = errors_of({})
    with pytest.raises(
        KafkaReadError, match=rf"{worker.topic('samples.solver')}: .*TOPIC_AUTHORIZATION_FAILED"
    ):
        TopicReader(worker, ["samples.solver"], from_beginning=True, **conf).close()
    with TopicReader(worker, ["weights"], from_beginning=True, **conf) as granted:  # its own: no error
        assert granted.ends


def test_broker_grant_gives_hand_started_components_their_acls(secured: launcher.BrokerState) -> None:
    from confluent_kafka import KafkaError

    ns = f"g{uuid.uuid4().hex[:8]}"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "astraflow.cli",
            "broker",
            "grant",
            "--recipe",
            str(REPO / "recipes" / "arithmetic.yaml"),
            "--data-dir",
            secured.data_dir,
        ],
        env=subprocess_env(ASTRAFLOW_NAMESPACE=ns),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.strip()) == len(
        acls.plan(KafkaSettings(bootstrap="x:1", namespace=ns), ["solver"])
    )
    assert not any(
        p in result.stdout + result.stderr
        for p in json.loads(  # where they are, never the passwords
            (Path(secured.data_dir) / "secure" / "credentials.json").read_text()
        )["passwords"].values()
    )
    worker = settings_of(secured, "worker", ns)
    assert _produce(worker, "trajectories") is None
    err = _produce(worker, "tasks")  # only the feeder writes tasks
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
