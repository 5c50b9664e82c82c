"""`astraflow broker start|stop|status|grant|fetch`: the local broker (one node, or a cluster of
several) and its ACLs. Registered by cli.py through `register(app)`; like the components'
commands, these import the broker inside the commands, to keep the command line light to import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli_output import console, fail, out
from astraflow.config.kafka import KafkaSettings
from astraflow.errors import AstraFlowError

broker_app = typer.Typer(
    help="Run a local single-node Apache Kafka (KRaft) from Maven Central jars.", no_args_is_help=True
)

DataDir = Annotated[
    Path | None, typer.Option("--data-dir", help="Broker directory (default: $ASTRAFLOW_HOME/broker).")
]


def register(app: typer.Typer) -> None:
    app.add_typer(broker_app, name="broker")


@broker_app.command("start")
def broker_start(
    port: Annotated[int, typer.Option(help="Client port on 127.0.0.1 (0: any free port).")] = 9092,
    data_dir: DataDir = None,
    heap: Annotated[
        str | None, typer.Option(help="JVM heap of each node (default: 512m, 256m per node of a cluster).")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the broker to answer.")] = 180.0,
    nodes: Annotated[
        int,
        typer.Option(
            help="KRaft nodes (combined broker+controller, a quorum of all): 3 makes a "
            "local cluster that survives one node's death (default data dir "
            "$ASTRAFLOW_HOME/cluster; --port is the first node's)."
        ),
    ] = 1,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="SASL_SSL (SCRAM-SHA-512) with a CA it makes, one user "
            "per component kind, ACLs enforced; credentials in DATA_DIR/secure.",
        ),
    ] = False,
    listener: Annotated[
        list[str] | None,
        typer.Option(
            "--listener",
            help="An extra PLAINTEXT listener NAME=BIND_HOST:PORT=ADVERTISED_HOST:PORT, e.g. one per "
            "region, advertised at the address its clients reach it by (repeatable).",
        ),
    ] = None,
) -> None:
    """Start the broker (or report the one already running) and print its bootstrap address."""
    from astraflow import broker

    if nodes > 1:
        from astraflow.broker import cluster

        try:
            cs = cluster.start(
                nodes,
                port=port,
                data_dir=data_dir,
                heap=heap or "256m",
                timeout=max(timeout, 240.0),
                progress=lambda m: console.print(m, highlight=False),
            )
        except AstraFlowError as exc:
            raise fail(str(exc)) from None
        console.print(
            f"Kafka {broker.kafka_version()} cluster of {nodes} nodes is up (PIDs "
            f"{', '.join(map(str, cs.pids))}); data {cs.data_dir}",
            highlight=False,
        )
        console.print(
            f"use it with: export ASTRAFLOW_BOOTSTRAP={cs.bootstrap} ASTRAFLOW_TOPICS_PROFILE=replicated",
            highlight=False,
        )
        out.print(cs.bootstrap, highlight=False)
        return
    heap = heap or "512m"
    try:
        listeners = dict(spec.split("=", 1) for spec in listener or [] if "=" in spec)
        if len(listeners) != len(listener or []):
            raise fail("--listener takes NAME=BIND_HOST:PORT[=ADVERTISED_HOST:PORT]")
        state = broker.start(
            port=port,
            data_dir=data_dir,
            heap=heap,
            timeout=timeout,
            progress=lambda m: console.print(m, highlight=False),
            secured=secure,
            listeners=listeners,
        )
    except AstraFlowError as exc:
        raise fail(str(exc)) from None
    console.print(
        f"Kafka {broker.kafka_version()} is up (PID {state.pid}); log: {state.log_file}", highlight=False
    )
    if state.secure:
        sdir = Path(state.data_dir) / "secure"
        console.print(
            f"SASL_SSL (SCRAM-SHA-512) only; CA {sdir / 'ca.pem'}; users and passwords (mode 0600) in "
            f"{sdir / 'credentials.json'}; ACLs deny everything not granted "
            f"(`astraflow run --secure` grants each component its own)",
            highlight=False,
        )
    else:
        console.print(f"use it with: export ASTRAFLOW_BOOTSTRAP={state.bootstrap}", highlight=False)
    out.print(state.bootstrap, highlight=False)


@broker_app.command("stop")
def broker_stop(
    data_dir: DataDir = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait after SIGTERM before SIGKILL.")] = 30.0,
) -> None:
    """Stop the broker (every node of a cluster) gracefully, by its recorded PIDs."""
    from astraflow import broker
    from astraflow.broker import cluster

    where = _cluster_dir(data_dir)
    if where is not None:
        cs = cluster.stop(where, timeout)
        console.print(
            f"stopped the cluster on {cs.bootstrap}" if cs else "no node of the cluster was running",
            highlight=False,
        )
        return
    state = broker.stop(data_dir, timeout)
    if state is None:
        console.print("no broker was running there")
    else:
        console.print(f"stopped the broker on {state.bootstrap} (PID {state.pid})", highlight=False)


@broker_app.command("status")
def broker_status(data_dir: DataDir = None) -> None:
    """Say whether the broker (each node of a cluster) runs and answers; exit 1 if not."""
    from astraflow import broker
    from astraflow.broker import cluster

    where = _cluster_dir(data_dir)
    if where is not None:
        cs, up, listed = cluster.status(where)
        assert cs is not None
        for i, (port, pid) in enumerate(zip(cs.ports, cs.pids, strict=True)):
            out.print(
                f"node {i + 1}: 127.0.0.1:{port} PID {pid} {'running' if up[i] else 'DOWN'}; "
                f"log {cs.node_dir(i) / 'logs' / 'kafka.log'}",
                highlight=False,
            )
        out.print(
            f"{cs.bootstrap}: {listed} of {len(cs.ports)} brokers in the cluster metadata", highlight=False
        )
        if listed < len(cs.ports):
            raise typer.Exit(1)
        return
    state, answering = broker.status(data_dir)
    if state is None:
        raise fail("no broker is running (start one with `astraflow broker start`)")
    word = "answering" if answering else "NOT answering"
    out.print(
        f"{state.bootstrap} PID {state.pid} {word}; data {state.data_dir}; log {state.log_file}",
        highlight=False,
    )
    if not answering:
        raise typer.Exit(1)


def _cluster_dir(data_dir: Path | None) -> Path | None:
    """The cluster directory `stop`/`status` mean: the given one if it holds a cluster, else (with
    no --data-dir and no single broker running) the default cluster's."""
    from astraflow import broker
    from astraflow.broker import cluster

    if data_dir is not None:
        return data_dir if cluster.is_cluster(data_dir) else None
    if broker.local_bootstrap() is None and cluster.is_cluster(cluster.default_cluster_dir()):
        return cluster.default_cluster_dir()
    return None


@broker_app.command("grant")
def broker_grant(
    recipe: Annotated[
        Path, typer.Option("--recipe", "-r", help="Recipe YAML (policies, group names, namespace).")
    ],
    data_dir: DataDir = None,
) -> None:
    """On a broker started with --secure: create the recipe's topics and grant each component kind
    (trainer, streams, worker, feeder) its least-privilege ACLs, as the admin principal. For
    components started by hand; `astraflow run --secure` does this itself."""
    from astraflow import broker, topics
    from astraflow.broker import acls, secure
    from astraflow.config import load_recipe
    from astraflow.kafka import make_admin

    data_dir = (data_dir or broker.default_data_dir()).expanduser().resolve()
    try:
        state, answering = broker.status(data_dir)
        if state is None or not answering or not state.secure:
            raise fail(
                f"no secured broker answers in {data_dir} (start one with `astraflow broker start --secure`)"
            )
        loaded = load_recipe(recipe)
        environ = secure.credentials(data_dir, "admin").env(state.bootstrap)
        if os.environ.get("ASTRAFLOW_NAMESPACE"):
            environ["ASTRAFLOW_NAMESPACE"] = os.environ["ASTRAFLOW_NAMESPACE"]
        settings = KafkaSettings.from_env(loaded.kafka, environ=environ)
        admin = make_admin(settings)
        topics.apply(admin, topics.expand(topics.load_spec(), loaded.policy_names, settings))
        grants = acls.plan(settings, loaded.policy_names, loaded.streams.app_id, loaded.worker.group)
        acls.apply(admin, grants)
    except AstraFlowError as exc:
        raise fail(str(exc)) from None
    sdir = data_dir / secure.SECURE_DIR
    console.print(
        f"{len(grants)} ACLs granted in namespace {settings.namespace!r} on {state.bootstrap}. "
        f"A component of kind K connects with ASTRAFLOW_SECURITY_PROTOCOL=SASL_SSL "
        f"ASTRAFLOW_SASL_USERNAME=K, ASTRAFLOW_SASL_PASSWORD from {sdir / secure.CREDENTIALS} and "
        f"ASTRAFLOW_SSL_CA_LOCATION={sdir / 'ca.pem'}",
        highlight=False,
    )
    out.print(str(len(grants)))


@broker_app.command("fetch")
def broker_fetch() -> None:
    """Resolve the Kafka jars into the cache (done automatically by `start`)."""
    from astraflow import broker

    try:
        libs = broker.ensure_jars(lambda m: console.print(m, highlight=False))
        broker.find_java()
    except AstraFlowError as exc:
        raise fail(str(exc)) from None
    out.print(str(libs))
