"""Test fixtures shared by every layer.

The broker: `make test` starts one throw-away Kafka for the whole run and passes its address in
ASTRAFLOW_TEST_BOOTSTRAP; a bare `pytest` starts its own. If none can be started the broker tests
fail (never skip). Each test gets its own topic namespace, so tests never see each other's data.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pytest

from astraflow.config import KafkaSettings

if TYPE_CHECKING:
    from astraflow.topics import TopicSpec

# Settings of the developer's shell must not leak into tests.
_SAVED_ENV = {
    k: os.environ.pop(k)
    for k in list(os.environ)
    if k.startswith("ASTRAFLOW_")
    and k not in ("ASTRAFLOW_TEST_BOOTSTRAP", "ASTRAFLOW_HOME", "ASTRAFLOW_LOG_LEVEL")
}

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker for this test session."""
    given = os.environ.get("ASTRAFLOW_TEST_BOOTSTRAP")
    if given:
        yield given
        return
    from astraflow import broker
    from astraflow.errors import BrokerError

    data_dir = tmp_path_factory.mktemp("kafka")
    try:
        state = broker.start(port=0, data_dir=data_dir)
    except BrokerError as exc:
        pytest.fail(f"a broker test needs a real Kafka broker and none could be started: {exc}")
    try:
        yield state.bootstrap
    finally:
        broker.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaSettings:
    """Connection settings with a namespace unique to this test."""
    return KafkaSettings(bootstrap=kafka_bootstrap, namespace=f"t{uuid.uuid4().hex[:10]}")


class MakeTopics(Protocol):
    """The `topics` fixture: creates the topics of topics.yaml for `policies` (default: "policy")."""

    def __call__(self, policies: list[str] | None = None) -> list[TopicSpec]: ...


@pytest.fixture
def topics(kafka: KafkaSettings) -> MakeTopics:
    """Create the topics of topics.yaml in this test's namespace; call with the policies."""
    from astraflow import topics as topic_spec
    from astraflow.kafka import make_admin

    def create(policies: list[str] | None = None) -> list[topic_spec.TopicSpec]:
        specs = topic_spec.expand(topic_spec.load_spec(), policies or ["policy"], kafka)
        topic_spec.apply(make_admin(kafka), specs)
        return specs

    return create


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes of tests: the repo importable, no leaked settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAFLOW_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def cli(*args: str) -> list[str]:
    """argv of `astraflow ARGS` in this interpreter, the way the runner's supervisor starts components."""
    return [sys.executable, "-m", "astraflow.cli", *args]


def worker_cmd(recipe: Path, run_dir: Path, worker_id: str, *args: str) -> list[str]:
    """argv of an `astraflow worker` of `recipe` joining the run in `run_dir` as `worker_id`."""
    return cli("worker", "--recipe", str(recipe), "--run-dir", str(run_dir), "--id", worker_id, *args)


def streams_cmd(recipe: Path, data_dir: Path, *args: str) -> list[str]:
    """argv of an `astraflow streams` worker of `recipe` keeping its Faust state in `data_dir`."""
    return cli("streams", "-r", str(recipe), "--data-dir", str(data_dir), "-l", "info", *args)


def run_cmd(recipe: Path, run_dir: Path, *args: str) -> list[str]:
    """argv of `astraflow run` of `recipe` into `run_dir` without the dashboard."""
    return cli("run", str(recipe), "--run-dir", str(run_dir), "--no-dashboard", *args)
