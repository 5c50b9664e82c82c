"""`create_app(recipe)`: the one Faust app of the streams component.

Layout (why one agent): every stage from validate to route runs inside ONE agent on
`trajectories` and the emitter task it queues complete groups for, as plain function calls, with
no topic between stages. The stages are all keyed
by group_id, which is already the key (and so the partitioning) of `trajectories`, so an
intermediate topic would buy no repartitioning, only cost: each 1,024-token trajectory (~13 kB)
would cross the broker once more per stage, every hop would add latency, and every hop would add
a crash window between producing and committing. Parallelism comes from the partitions of
`trajectories` (one streams worker per partition at most). The one place where data must change
key is `task_stats` (a task's attempts are different groups): a group on the partition its task_id
hashes to (where workers send them) is folded into the per-task table as it is emitted, and any
other's summary goes through an internal topic keyed by task_id to a second agent on that table.
Both agents run with concurrency=1 (faust issue #606: with more, faust can commit an offset past an
in-flight event, which loses it in a crash).

State: two Faust tables (`groups`, `bodies`; memory store, rebuilt from their changelog topics at
start) and, with `task_stats`, a third (`task_stats`). Faust creates the changelog and internal
topics; the source and sink topics come from topics.yaml (`astraflow topics apply`), and the app
refuses to start without them, because Faust would otherwise consume nothing and say little.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow import gcpause
from astraflow.config import Recipe
from astraflow.config.kafka import KafkaSettings
from astraflow.errors import ConfigError
from astraflow.kafka import fetch_limit, make_admin, resolve, wait_for_topics
from astraflow.kafka_faust import faust_settings
from astraflow.topics import DEADLETTER, METRICS, TASK_STATS, TRAJECTORIES
from astraflow.topics import samples as samples_topic
from streams.api import StageContext
from streams.emission import failpoint_from_env
from streams.grouping import GroupCollector
from streams.pipeline import build_pipeline
from streams.recovery_watch import inject_stall

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cluster:
    """What the app needs to know about the topics it reads and writes."""

    partitions: dict[str, int]  # full topic name -> partition count
    replication: int


def default_data_dir(app_id: str) -> Path:
    home = Path(os.environ.get("ASTRAFLOW_HOME") or Path.home() / ".cache" / "astraflow").expanduser()
    return home / "streams" / app_id


def check_topics(settings: KafkaSettings, bases: list[str], timeout: float = 15.0) -> Cluster:
    """Partition counts of the topics the pipeline needs; a clear ConfigError if any is missing."""
    try:
        md = make_admin(settings).list_topics(timeout=timeout)
    except Exception as exc:  # confluent raises KafkaException with a transport error
        raise ConfigError(f"streams: cannot reach Kafka at {settings.bootstrap}: {exc}") from None
    names = [settings.topic(b) for b in bases]
    missing = [n for n in names if n not in md.topics or md.topics[n].error is not None]
    if missing:
        raise ConfigError(
            f"streams: missing topic(s) {', '.join(missing)} on {settings.bootstrap}. The broker does not "
            f"create topics on use; create them with `astraflow topics apply --recipe <recipe>` "
            f"(namespace {settings.namespace!r})."
        )
    parts = {n: len(md.topics[n].partitions) for n in names}
    first = md.topics[names[0]].partitions[0]
    return Cluster(partitions=parts, replication=max(1, len(first.replicas)))


def precreate(
    settings: KafkaSettings, faust_topics: list[Any], partitions: int, replication: int, timeout: float = 30.0
) -> list[str]:
    """Create Faust's internal topics (table changelogs, task updates) that do not exist yet, and
    wait until the cluster metadata shows them. Faust creates them itself at start and subscribes
    right after; a topic the metadata does not show yet is dropped from the subscription (faust
    0.15.3 logs "Ignoring missing topic"): its agent never gets a record and a send to it waits,
    which stalls the pipeline agent on a fresh broker. Returns the names created."""
    from mode.utils.times import want_seconds

    from astraflow.topics import TopicSpec, apply

    admin = make_admin(settings)
    existing = admin.list_topics(timeout=timeout).topics
    specs = []
    for topic in faust_topics:
        configs = {str(k): str(v) for k, v in (topic.config or {}).items()}
        cleanup = [flag for flag, on in (("compact", topic.compacting), ("delete", topic.deleting)) if on]
        if cleanup:
            configs["cleanup.policy"] = ",".join(cleanup)
        if topic.retention:
            configs["retention.ms"] = str(int(want_seconds(topic.retention) * 1000))
        for name in topic.topics:
            if name not in existing:
                specs.append(
                    TopicSpec(
                        name=name,
                        base=name,
                        record="internal",
                        partitions=topic.partitions or partitions,
                        replication=topic.replicas or replication,
                        configs=configs,
                    )
                )
    if not specs:
        return []
    return apply(admin, specs, timeout=timeout).created


def create_app(
    recipe: Recipe,
    *,
    kafka: KafkaSettings | None = None,
    data_dir: str | Path | None = None,
    web_port: int | None = None,
    instance_id: str | None = None,
) -> Any:
    """Build the Faust app for `recipe`'s streams pipeline. Checks the pipeline (names, arguments,
    order) and the topics before Faust starts. `app.astraflow` is the StreamsRuntime."""

    from streams.faust_glue import AstraFaustApp, FaustTable, check_versions, make_table, register_codec
    from streams.runtime import StreamsRuntime, Topics, fatal

    check_versions()
    register_codec()
    cfg = recipe.streams
    settings = resolve(kafka or recipe.kafka)
    ctx = StageContext(policies=recipe.policy_names, max_staleness=recipe.max_staleness, seed=recipe.seed)
    pipeline = build_pipeline(cfg, ctx)
    with_stats = bool(pipeline.task_stats)
    bases = [TRAJECTORIES, *(samples_topic(p) for p in recipe.policy_names), DEADLETTER, METRICS]
    if with_stats:
        bases.append(TASK_STATS)
    wait_for_topics(settings, bases)  # started by `astraflow run` while its broker boots
    cluster = check_topics(settings, bases)
    traj_topic = settings.topic(TRAJECTORIES)
    n_parts = cluster.partitions[traj_topic]

    app_id = settings.group(cfg.app_id)
    datadir = Path(data_dir or cfg.data_dir or default_data_dir(app_id)).expanduser()
    datadir.mkdir(parents=True, exist_ok=True)
    port = web_port or cfg.web_port
    app = AstraFaustApp(
        app_id,
        **faust_settings(settings),
        store="memory://",
        datadir=str(datadir),
        autodiscover=False,
        web_enabled=port is not None,
        web_port=port or 6066,
        processing_guarantee="at_least_once",
        topic_replication_factor=cluster.replication,
        topic_partitions=n_parts,
        broker_commit_interval=cfg.commit_every_s,
        consumer_auto_offset_reset="earliest",
        producer_max_batch_size=1 << 20,
        producer_linger_ms=cfg.producer_linger_ms,
        key_serializer="raw",
        value_serializer="raw",
    )
    # compact quickly: the bodies changelog holds trajectories only until their group is emitted
    compact = {
        "segment.ms": "600000",
        "min.cleanable.dirty.ratio": "0.1",
        "max.message.bytes": str(fetch_limit(settings)),
    }
    groups = make_table(app, "groups", n_parts, "msgpack", compact)
    bodies = make_table(app, "bodies", n_parts, "raw", compact)  # the trajectory bytes as consumed

    raw = {"key_serializer": "raw", "value_serializer": "raw"}
    source = app.topic(traj_topic, **raw)
    samples = {p: app.topic(settings.topic(samples_topic(p)), **raw) for p in recipe.policy_names}
    task_updates = task_stats_topic = stats_table = None
    if with_stats:
        task_updates = app.topic(
            f"{app_id}-task-updates",
            internal=True,
            partitions=n_parts,
            key_serializer="raw",
            value_serializer="msgpack",
        )
        task_stats_topic = app.topic(settings.topic(TASK_STATS), **raw)
        stats_table = make_table(app, "task_stats", n_parts, "msgpack", {})

    internal = [groups.changelog_topic, bodies.changelog_topic]
    if task_updates is not None:
        internal += [task_updates, stats_table.changelog_topic]
    precreate(settings, internal, n_parts, cluster.replication)

    topics = Topics(
        trajectories=traj_topic,
        samples=samples,
        sample_partitions={
            p: cluster.partitions[settings.topic(samples_topic(p))] for p in recipe.policy_names
        },
        task_updates=task_updates,
        task_stats=task_stats_topic,
    )
    runtime = StreamsRuntime(
        app,
        pipeline,
        GroupCollector(pipeline.group, FaustTable(groups), FaustTable(bodies)),
        topics,
        settings,
        FaustTable(stats_table) if stats_table is not None else None,
        instance_id or f"streams-{socket.gethostname()}-{os.getpid()}",
        commit_every_s=cfg.commit_every_s,
        max_task_stats=cfg.max_task_stats,
        max_cached_trajectories=cfg.max_cached_trajectories,
        recovery_stall_s=cfg.recovery_stall_s,
    )
    app.astraflow = runtime
    app.fetch_max_wait_ms = cfg.fetch_max_wait_ms or (500 if settings.wan else 20)
    app.watch = lambda: runtime.recovery_watch.check(time.monotonic())
    if failpoint_from_env(("stall_recovery",)) is not None:
        inject_stall(app)

    @app.agent(source, concurrency=1, name="pipeline")
    async def pipeline_agent(stream: Any) -> None:
        # acknowledged by the runtime: a record that brings its group complete only once the group
        # is done (streams/runtime.py, `on_record`)
        manual = stream.noack()
        async for event in manual.events():
            try:
                await runtime.on_record(event.message, functools.partial(manual.ack, event))
            except Exception as exc:
                fatal(app, "the pipeline agent", exc)

    if task_updates is not None:
        # the agent reads the same topic as raw bytes and checks them itself (streams/stats.py,
        # `parse_summary`): faust's msgpack decoding would raise out of the stream, outside any
        # handler, and a poison record would crash-loop the worker
        task_updates_in = app.topic(task_updates.get_topic_name(), internal=True, partitions=n_parts, **raw)

        @app.agent(task_updates_in, concurrency=1, name="task_stats")
        async def task_stats_agent(stream: Any) -> None:
            async for event in stream.events():
                try:
                    await runtime.on_task_update(event)
                except Exception as exc:
                    fatal(app, "the task_stats agent", exc)

    @app.task
    async def emitter() -> None:
        gcpause.settle()  # the app is built and started
        try:
            await runtime.emitter.run()
        except Exception as exc:
            fatal(app, "the group emitter", exc)

    @app.timer(cfg.sweep_every_s, name="sweep")
    async def sweep() -> None:
        try:
            await runtime.sweep()
        except Exception as exc:
            fatal(app, "the group sweep", exc)

    @app.timer(cfg.metrics_every_s, name="metrics")
    async def metrics() -> None:
        runtime.report()

    @app.on_before_shutdown.connect
    async def _close(sender: Any, **kwargs: Any) -> None:
        runtime.close()

    return app
