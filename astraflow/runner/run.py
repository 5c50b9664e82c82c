"""`astraflow run RECIPE`: every component of a recipe under one supervisor.

In order: validate the recipe; use the configured Kafka or start a local broker whose data lives
in the run directory (so a second `run` on the same directory resumes with its topics, offsets and
checkpoints); apply the topics; start trainers (one per policy), the streams worker, the rollout
workers (count and regions from the recipe) and the feeder as supervised processes (on its own local
broker, as soon as its port is chosen: they wait for their topics); show the live
dashboard; restart a component that crashes. At its limits (`--max-steps`: every trainer reached
it; `--max-minutes`), on Ctrl-C or SIGTERM it stops everything in reverse order (feeder, workers,
streams, trainers, broker) and writes the report: metrics JSONL, TensorBoard events, PNG plots,
final checkpoints and a summary. Its options and the components it starts are planned in plan.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from astraflow import broker, gcpause, topics
from astraflow.broker import acls, secure
from astraflow.config import KafkaSettings, load_recipe
from astraflow.errors import ConfigError
from astraflow.kafka import TOPICS_WAIT_ENV, make_admin, make_producer
from astraflow.runner.advice import advise, measure, rows_from_history
from astraflow.runner.collector import MetricsCollector
from astraflow.runner.dashboard import render
from astraflow.runner.plan import RunOptions, components, run_dir_of
from astraflow.runner.report import preload, summary_text, write_report
from astraflow.runner.stall import StallDetector, observe
from astraflow.runner.supervisor import Component, Supervisor
from astraflow.weights.auth import SECRET_ENV
from astraflow.weights.server import TLS_CERT_ENV
from astraflow.weights.transport import CA_ENV, TOKEN_ENV

log = logging.getLogger(__name__)

ADVICE_EVERY_S = 10.0  # how often the dashboard measures what bounds the run
ADVICE_WINDOW_S = 120.0  # over the last this many seconds: recent enough to follow a change of workers
FINISHED = "every trainer reached"  # the stop reason of a run that reached its steps
TOPICS_WAIT_S = 300  # how long a component waits for the run's topics: a broker's first start, then them


def component_kind(name: str) -> str:
    """The principal of a component (`trainer-solver` -> `trainer`, `worker-3` -> `worker`)."""
    kind = name.split("-", 1)[0]
    if kind not in secure.KINDS:
        raise ConfigError(
            f"component {name!r} has no principal of its own (known: {', '.join(secure.KINDS)})"
        )
    return kind


class Run:
    """One invocation of `astraflow run`."""

    def __init__(self, recipe_path: Path, opts: RunOptions, console: Console | None = None) -> None:
        self.recipe_path = recipe_path.resolve()
        self.recipe = load_recipe(recipe_path)
        self.opts = opts
        # plain text: event, progress and summary lines hold paths and "[progress]", not rich markup
        self.console = console or Console(
            stderr=True, soft_wrap=not sys.stderr.isatty(), markup=False, highlight=False
        )
        self.run_dir = run_dir_of(self.recipe, opts.run_dir).resolve()
        self.events: list[str] = []
        self.stop_reason = "running"
        self.started_broker = False
        self.admin: Any = None
        self.producer_ids: Any = None
        self.sup: Supervisor | None = None
        self._signals = 0

    def event(self, message: str) -> None:
        stamped = f"{time.strftime('%H:%M:%S')} {message}"
        self.events.append(stamped)
        with open(self.run_dir / "events.log", "a") as fh:
            fh.write(stamped + "\n")
        if not self.opts.dashboard:
            self.console.print(stamped)

    def _kafka(self) -> KafkaSettings:
        settings = KafkaSettings.from_env(self.recipe.kafka)
        if self.opts.secure:
            return self._secure_kafka(settings)
        if settings.bootstrap:
            if settings.namespace is None:  # a shared cluster: keep this run's topics apart
                settings = settings.model_copy(update={"namespace": self.recipe.name})
            self.event(f"using Kafka at {settings.bootstrap} (namespace {settings.namespace})")
            return settings
        state = broker.start(
            port=0,
            data_dir=self.run_dir / "broker",
            progress=self.event,
            die_with_parent=True,
            quick_jit=True,  # it lives as long as the run: C2's compiling costs more than it saves
            on_address=lambda b: self._start_early(settings.model_copy(update={"bootstrap": b})),
        )
        self.started_broker = True
        self.event(
            f"local Kafka {broker.kafka_version()} at {state.bootstrap} (data {self.run_dir / 'broker'})"
        )
        return settings.model_copy(update={"bootstrap": state.bootstrap})

    def _supervisor(self, settings: KafkaSettings) -> Supervisor:
        env = {
            **os.environ,
            **self.opts.extra_env,
            "ASTRAFLOW_BOOTSTRAP": settings.require_bootstrap(),
            TOPICS_WAIT_ENV: str(TOPICS_WAIT_S),
        }
        if settings.namespace:
            env["ASTRAFLOW_NAMESPACE"] = settings.namespace
        sup = Supervisor(self.run_dir, env, on_event=self.event)
        for c in components(self.recipe, self.recipe_path, self.run_dir, self.opts):
            sup.add(c)
        return sup

    def _start_early(self, settings: KafkaSettings) -> None:
        """Every component, while the local broker boots: each waits for its topics (TOPICS_WAIT_S)
        after its imports and models. Started once the broker answered, trainers and workers took
        ~6 s on 2 cores to import torch and load their models, on the way to the first step."""
        self.sup = self._supervisor(settings)
        self.sup.start_all()

    def _secure_kafka(self, settings: KafkaSettings) -> KafkaSettings:
        """The run's own secured broker; this process connects as its `admin` super user."""
        if settings.bootstrap:
            raise ConfigError(
                f"--secure starts a secured local broker, but a bootstrap is configured "
                f"({settings.bootstrap}); for a secured cluster of your own, set its ASTRAFLOW_SASL_* "
                f"and ASTRAFLOW_SSL_* variables instead of --secure"
            )
        data_dir = self.run_dir / "broker"
        state = broker.start(
            port=0,
            data_dir=data_dir,
            progress=self.event,
            die_with_parent=True,
            secured=True,
            quick_jit=True,
        )
        self.started_broker = True
        self.event(
            f"local Kafka {broker.kafka_version()} at {state.bootstrap}, SASL_SSL (SCRAM-SHA-512) with ACLs "
            f"(credentials in {data_dir / 'secure'})"
        )
        env = secure.credentials(data_dir, "admin").env(state.bootstrap)
        return KafkaSettings.from_env(settings, environ=env)

    def _grant(self, settings: KafkaSettings, comps: list[Component]) -> None:
        """Least-privilege ACLs for this run's namespace and policies, each component's own principal
        in its environment (it never sees another kind's password), and a weight-server token for
        the trainers and workers."""
        grants = acls.plan(
            settings, self.recipe.policy_names, self.recipe.streams.app_id, self.recipe.worker.group
        )
        acls.apply(self.admin, grants)
        self.event(f"ACLs: {len(grants)} grants for trainer, streams, worker and feeder")
        data_dir = self.run_dir / "broker"
        bootstrap = settings.require_bootstrap()
        kept = secure.run_secrets(data_dir)  # the same on a resume: events already on `weights` stay valid
        token = kept["weights_token"]  # the weight server's: trainers serve, workers read
        mac_key = kept["weights_mac_key"]  # WeightVersion HMACs: trainers sign, workers and the feeder verify
        for c in comps:
            kind = component_kind(c.name)
            c.env.update(secure.credentials(data_dir, kind).env(bootstrap))
            if kind in ("trainer", "worker"):  # weights over https with the token, checked against the CA
                c.env[TOKEN_ENV] = token
                c.env[CA_ENV] = str(secure.secure_dir(data_dir) / "ca.pem")
            if kind == "trainer":
                c.env[TLS_CERT_ENV] = str(secure.secure_dir(data_dir) / "weights.pem")
            if kind in ("trainer", "worker", "feeder"):
                c.env[SECRET_ENV] = mac_key

    def _handle_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        self.stop_reason = "interrupted" if signum == signal.SIGINT else "terminated"
        if self._signals > 1:
            raise KeyboardInterrupt  # second Ctrl-C: stop waiting politely

    def execute(self) -> dict[str, Any]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resumed = (self.run_dir / "summary.json").exists() or (self.run_dir / "logs").exists()
        shutil.copyfile(self.recipe_path, self.run_dir / "recipe.yaml")
        previous = {s: signal.signal(s, self._handle_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self.event(("resuming" if resumed else "starting") + f" {self.recipe.name} in {self.run_dir}")
        started = time.time()
        collector: MetricsCollector | None = None
        try:
            settings = self._kafka()
            # a new broker answers the first producer-id request "coordinator load in progress" while it
            # fetches a block of ids from its controller, and librdkafka retries 0.5 s later: asked here,
            # the block is there when the components' producers ask
            self.producer_ids = make_producer(settings, log_level=3)  # not its expected retry warning
            specs = topics.expand(topics.load_spec(), self.recipe.policy_names, settings)
            self.admin = make_admin(settings)  # held for the whole run, never freed while clients work
            report = topics.apply(self.admin, specs)
            self.event(f"topics: {len(report.created)} created, {len(report.unchanged)} unchanged")
            self.sup = self.sup or self._supervisor(settings)
            if self.opts.secure:  # every component starts here, after its grants
                self._grant(settings, self.sup.components)
            collector = MetricsCollector(
                settings,
                jsonl=self.run_dir / "metrics.jsonl",
                streams_group=self.recipe.streams.app_id,
                worker_group=self.recipe.worker.group,
            ).start()
            self.sup.start_all()
            self._watch(self.sup, collector, started)
        except KeyboardInterrupt:
            self.stop_reason = "interrupted twice"
            if self.sup is not None:
                self.sup.kill_all()
        finally:
            threading.Thread(target=preload, name="report-imports", daemon=True).start()
            if self.sup is not None:
                self.sup.stop_all(together=self.stop_reason.startswith(FINISHED))
            if collector is not None:
                collector.stop()
            # the last client of this process: freed before the broker stops, or librdkafka prints a
            # "Connection refused" line a second after the run has ended
            self.admin = self.producer_ids = None
            # the broker's JVM takes ~2 s to shut down: the report is written meanwhile (unless the
            # run is failing, then the broker is stopped before the error goes on)
            broker_stop = self._stop_broker() if self.started_broker else None
            if broker_stop is not None and sys.exc_info()[0] is not None:
                self._join_broker(broker_stop)  # the code after this block does not run
            for s, h in previous.items():
                signal.signal(s, h)
        sup: Supervisor | None = self.sup
        try:
            restarts = {c.name: c.restarts for c in sup.components if c.restarts} if sup else {}
            extra = {
                "recipe": self.recipe.name,
                "run_dir": str(self.run_dir),
                "stop_reason": self.stop_reason,
                "wall_minutes": (time.time() - started) / 60,
                "restarts": restarts,
                "deadletters": collector.snapshot().deadletters if collector else 0,
                "checkpoints": self._latest_checkpoints(),
                "failed": [c.name for c in sup.failed()] if sup else [],
            }
            summary = write_report(self.run_dir, extra, max_episodes=self.recipe.worker.max_episodes)
        finally:
            if broker_stop is not None:
                self._join_broker(broker_stop)
        self.console.print(summary_text(summary))
        self.console.print(
            f"report: {self.run_dir}/summary.txt, plots in {self.run_dir}/plots, "
            f"tensorboard --logdir {self.run_dir}/tensorboard"
        )
        return summary

    def _stop_broker(self) -> threading.Thread:
        thread = threading.Thread(target=broker.stop, args=(self.run_dir / "broker",), name="broker-stop")
        thread.start()
        return thread

    def _join_broker(self, thread: threading.Thread) -> None:
        thread.join()
        self.event("stopped the local broker")

    def _latest_checkpoints(self) -> dict[str, str]:
        out = {}
        for policy in self.recipe.policy_names:
            found = sorted((self.run_dir / "trainer" / policy / "checkpoints").glob("step-*"))
            if found:
                out[policy] = str(found[-1])
        return out

    def _watch(self, sup: Supervisor, collector: MetricsCollector, started: float) -> None:
        max_steps = self.opts.max_steps or self.recipe.run.max_steps
        max_minutes = self.opts.max_minutes or self.recipe.run.max_minutes
        trainers = [c for c in sup.components if c.name.startswith("trainer-")]
        gcpause.settle()  # everything is started; watching is all that is left
        live = (
            Live(console=self.console, refresh_per_second=2, transient=False) if self.opts.dashboard else None
        )
        stalls = StallDetector()
        window = self.recipe.admission_window if self.recipe.feeder.admission else None
        with live if live is not None else contextlib.nullcontext():
            last_line = last_advice = 0.0
            advice, regime = None, "unknown"
            while self.stop_reason == "running":
                sup.poll()
                snap = collector.snapshot()
                steps, flow = observe(snap, self.recipe.policy_names, window)
                done = frozenset(c.name.removeprefix("trainer-") for c in trainers if c.exit_code == 0)
                for line in stalls.update(steps, time.time(), flow, done):
                    self.event(line)  # also in events.log: a hang is never silent
                    asked = sup.dump_stacks()
                    self.event(
                        f"stall: the thread stacks of {', '.join(asked)} are in their logs "
                        f"({self.run_dir}/logs)"
                    )
                if time.time() - last_advice > ADVICE_EVERY_S:
                    last_advice = time.time()
                    advice = advise(
                        measure(
                            rows_from_history(collector.history()),
                            window_s=ADVICE_WINDOW_S,
                            max_episodes=self.recipe.worker.max_episodes,
                        )
                    )
                    if advice.regime != regime:  # a change of regime is an event; its numbers are not
                        regime = advice.regime
                        self.event(f"scaling: {advice.line}")
                if live is not None:
                    live.update(
                        render(
                            snap,
                            self.recipe.policy_names,
                            f"astraflow run {self.recipe.name}",
                            self.events,
                            advice.line if advice else None,
                            stall=stalls.current(),
                        )
                    )
                elif time.time() - last_line > 15:
                    last_line = time.time()
                    self._progress_line(snap)
                if max_steps and all(c.exit_code == 0 for c in trainers):
                    self.stop_reason = f"{FINISHED} {max_steps} steps"
                elif max_minutes and time.time() - started >= max_minutes * 60:
                    self.stop_reason = f"time limit of {max_minutes:g} minutes"
                elif sup.failed():
                    self.stop_reason = "failed: " + ", ".join(c.name for c in sup.failed())
                else:
                    sup.wait_for_exit(trainers, 0.5)  # a trainer that reached its steps is seen at once
        self.event(f"stopping: {self.stop_reason}")

    def _progress_line(self, snap: Any) -> None:
        parts = []
        for p in self.recipe.policy_names:
            t = next((i for i in snap.of("trainer") if i.id == f"trainer.{p}"), None)
            if t is not None:
                v = t.values
                parts.append(
                    f"{p}: step {v.get('step', 0):.0f} reward {v.get('reward.mean', float('nan')):.3f}"
                )
        tokens = sum(w.values.get("worker.tokens_per_s", 0) for w in snap.of("worker"))
        self.console.print(
            f"[progress] {'; '.join(parts) or 'waiting for the first step'}; "
            f"rollout {tokens:.0f} tokens/s; dead letters {snap.deadletters}"
        )


def save_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))
