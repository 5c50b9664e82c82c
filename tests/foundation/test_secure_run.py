"""A recipe trained end to end on `astraflow run --secure`: one SASL_SSL principal per component, weights
over HTTPS with the run's token, and a forged WeightVersion dead-lettered. The secured broker's
refusals, one by one: test_secure_broker.py."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from astraflow.broker import launcher
from astraflow.kafka import client_config, read_to_end
from tests.conftest import subprocess_env
from tests.e2e.helpers import (
    endless_recipe,
    finish,
    processes_of,
    start_run,
    summary,
    trainer_steps,
    wait_for,
)
from tests.kafka_helpers import settings_of

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _forge_weights(run_dir: Path) -> None:
    """Publish version 999 of `solver` pointing elsewhere, unsigned, as the trainer principal."""
    from astraflow.records import WeightVersion, encode

    state = launcher.BrokerState.load(run_dir / "broker")
    assert state is not None and state.secure
    settings = settings_of(state, "trainer")
    forged = WeightVersion(
        policy="solver",
        version=999,
        step=999,
        snapshot_version=999,
        snapshot_uri="file:///dev/null",
        snapshot_sha256="0" * 64,
        groups_consumed=10**6,
    )
    from confluent_kafka import Producer

    producer = Producer(client_config(settings))
    producer.produce(settings.topic("weights"), encode(forged), key=b"solver")
    assert producer.flush(30) == 0


@pytest.mark.e2e
def test_a_recipe_trains_end_to_end_on_the_secured_broker_with_one_principal_per_component(
    tmp_path: Path,
) -> None:
    # weights over HTTPS: the worker fetches them from the trainer's server with the run's token and CA
    recipe = endless_recipe(tmp_path, serve_http=True)
    run_dir = tmp_path / "run"
    # no step limit: every component is alive while its environment is read and the forged event sent
    # (with --max-steps 6 the trainer could finish and exit first: CI saw it once, after the runs' start
    # and end got faster); stopped with Ctrl-C once it has trained 6 steps
    proc = start_run(recipe, run_dir, subprocess_env(), "--secure")
    wait_for(lambda: trainer_steps(run_dir, "solver") >= 1 or proc.poll() is not None, 900, "a trainer step")
    assert proc.poll() is None, finish(proc, 60)[-5000:]
    # every component runs as its own kind's principal, over SASL_SSL; none holds the admin password
    users = {}
    for pid, cmd in processes_of(run_dir):
        env = _environ(pid)
        for kind in ("trainer", "streams", "worker", "feed"):
            if f"astraflow.cli {kind} " in cmd or f"astraflow {kind} " in cmd:
                users[kind] = (env.get("ASTRAFLOW_SASL_USERNAME"), env.get("ASTRAFLOW_SECURITY_PROTOCOL"))
    assert users == {
        "trainer": ("trainer", "SASL_SSL"),
        "streams": ("streams", "SASL_SSL"),
        "worker": ("worker", "SASL_SSL"),
        "feed": ("feeder", "SASL_SSL"),
    }, users
    tokens = {
        kind: _environ(pid).get("ASTRAFLOW_WEIGHTS_TOKEN")
        for pid, cmd in processes_of(run_dir)
        for kind in ("trainer", "worker", "feed", "streams")
        if f"astraflow.cli {kind} " in cmd
    }
    assert tokens["trainer"] and tokens["trainer"] == tokens["worker"], tokens
    assert tokens["feed"] is None and tokens["streams"] is None, tokens
    # a forged WeightVersion, even from a principal allowed to write `weights`, is dead-lettered
    _forge_weights(run_dir)
    wait_for(
        lambda: "mac: missing" in (run_dir / "logs" / "worker-0.log").read_text() or proc.poll() is not None,
        120,
        "the worker to dead-letter the forged event",
    )
    state = launcher.BrokerState.load(run_dir / "broker")
    assert state is not None
    events = [e for _, e in read_to_end(settings_of(state, "admin"), "weights")]
    signed = [e for e in events if e.mac is not None]
    assert signed and len(signed) == len(events) - 1  # all but the forged one
    assert all(e.snapshot_uri.startswith("https://127.0.0.1:") for e in signed), signed[0].snapshot_uri
    wait_for(lambda: trainer_steps(run_dir, "solver") >= 6 or proc.poll() is not None, 900, "6 trainer steps")
    proc.send_signal(signal.SIGINT)
    out = finish(proc, 900)
    assert proc.returncode == 0, out[-5000:]
    assert "SASL_SSL (SCRAM-SHA-512) with ACLs" in out and "stopped because: interrupted" in out
    trained = summary(run_dir)["policies"]["solver"]["steps"]
    assert trained >= 6
    assert processes_of(run_dir) == []
    # the streams worker (Faust/aiokafka) did its part over SCRAM-SHA-512 and SSL: samples reached the trainer
    assert "Traceback" not in (run_dir / "logs" / "streams.log").read_text()
    # the worker loaded published weights over HTTPS with the token, never refused by the server (the
    # last version may be refused with "connection refused": the trainer, done, stops serving first)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = [r["values"] for r in rows if r["component"] == "worker"][-1]
    assert last["worker.weights_applied"] >= 1, last
    assert "HTTP 401" not in (run_dir / "logs" / "worker-0.log").read_text()
    assert (
        max(r["values"].get("worker.weight_version.solver", 0) for r in rows if r["component"] == "worker")
        < 999
    )
    for log_name in ("worker-0.log", "feeder.log"):
        assert (
            "dead-lettered" in (text := (run_dir / "logs" / log_name).read_text()) and "mac: missing" in text
        ), log_name
    denied = [
        line
        for line in (run_dir / "broker" / "logs" / "kafka.log").read_text().splitlines()
        if "is Denied operation" in line
    ]
    assert denied == [], denied[:5]
    # the directory resumes secured only: its broker, users, ACLs and run secrets are kept
    plain = start_run(recipe, run_dir, subprocess_env(), "--max-steps", str(trained + 2))
    assert plain.wait(120) != 0 and "holds a secured broker" in finish(plain, 10)
    again = start_run(recipe, run_dir, subprocess_env(), "--max-steps", str(trained + 2), "--secure")
    out = finish(again, 900)
    assert again.returncode == 0, out[-5000:]
    assert "resuming arithmetic" in out and f"every trainer reached {trained + 2} steps" in out
    # events signed before the restart still verify: only the forged one is refused again
    assert "mac: does not match" not in (run_dir / "logs" / "worker-0.log").read_text()
    assert processes_of(run_dir) == []
