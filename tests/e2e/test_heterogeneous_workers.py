"""Unlike workers share the work by what they finish: `astraflow run` with two rollout workers from
outside, `fast` (4 episodes at once, 0.5 s each) and `slow` (one at a time, SLOW_MS each), paced by
the test-only failpoint ASTRAFLOW_WORKER_FAILPOINT=episode_delay_ms:N (a sleep, no CPU).

The feeder sends each task to the partition of `tasks` with the fewest tasks not yet done
(workers/routing.py), so the slow worker's partitions get a task only once it has caught up and the
fast worker gets the rest: it must do at least twice the slow one's episodes while both serve. With
tasks keyed by task_id (`feeder.routing: task_id`) each got half the partitions' tasks whatever its
speed, and the admission window filled with tasks waiting on the slow one: both did about as many
(bench/RESULTS.md, "Heterogeneous workers"). At the end, with the feeder stopped, the ledger: every
task fed trained exactly once or counted as dropped under a reason, and every episode arrived."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from astraflow.config import KafkaSettings
from astraflow.records import Task
from tests.e2e.helpers import finish, recipe_copy, run_env, start_run, wait_for
from tests.e2e.outside import (
    accounted,
    alive,
    check_ledger,
    dropped_groups,
    episodes_now,
    feeder_pid,
    start_worker,
    stop,
    trained_groups,
    untrained_batches,
)
from tests.workers.kafka_util import read_topic, read_trajectories

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.slow]

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
GROUP = 4
SLOW_MS = 1000
#: worker -> (worker.max_episodes, episode delay in ms): at most 8 and 1 episodes per second
WORKERS = {"fast": (4, 500), "slow": (1, SLOW_MS)}
#: groups trained while the split is measured (about 20 s here; the slow worker alone would take
#: GROUP x SLOW_MS x MEASURED = 160 s)
MEASURED = 40
ROUTING = "least_outstanding"


@pytest.mark.timeout(1500)
def test_a_fast_worker_does_more_than_a_slow_one_and_nothing_is_lost(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # admission: at most (2 + 1) x 2 x 1 = 6 groups ahead of the trainer; the feeder runs on until
    # the test stops it
    recipe = recipe_copy(
        "arithmetic",
        tmp_path,
        model=TINY,
        feeder={"group_size": GROUP, "routing": ROUTING},
        worker={"count": 0, "metrics_every_s": 1.0, "drain_timeout_s": 20},
        trainer={"batch_groups": 1, "publish_every": 2},
        run={"max_steps": None},
    )
    run_dir = tmp_path / "run"
    env = run_env(kafka_bootstrap)
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, namespace=env["ASTRAFLOW_NAMESPACE"])
    run = start_run(recipe, run_dir, env)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        wait_for(
            lambda: (run_dir / "init" / "solver" / "config.json").exists() or run.poll() is not None,
            600,
            "the run's initial checkpoint",
        )
        assert run.poll() is None, finish(run, 60)[-3000:]
        for w, (episodes, delay_ms) in WORKERS.items():
            procs[w] = start_worker(recipe, run_dir, env, w, episodes, delay_ms)
        # both in the group (each has rolled out a task): the split is measured from here
        wait_for(lambda: set(procs) <= set(episodes_now(kafka)), 900, "both workers to roll out a task")
        before, t0 = episodes_now(kafka), time.monotonic()
        start = len(trained_groups(run_dir, "solver"))
        wait_for(
            lambda: len(trained_groups(run_dir, "solver")) >= start + MEASURED,
            600,
            f"{MEASURED} groups trained by the pair",
        )
        after, seconds = episodes_now(kafka), time.monotonic() - t0
        # no more tasks; everything fed must come out of the loop
        feeder = feeder_pid(run_dir)
        os.kill(feeder, signal.SIGTERM)  # it saves its position and exits 0: the supervisor lets it be
        wait_for(lambda: not alive(feeder), 120, "the feeder to stop")
        fed = [t.group_id for t in read_topic(kafka, "tasks") if isinstance(t, Task)]
        wait_for(
            lambda: accounted(run_dir) >= len(fed), 600, f"all {len(fed)} tasks fed to be trained or dropped"
        )
        stop(procs, list(WORKERS), run_dir)
        run.send_signal(signal.SIGINT)
        out = finish(run, 240)
        assert run.returncode == 0, out[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if run.poll() is None:
            run.kill()
            run.wait()
    assert "restarted feeder" not in (run_dir / "events.log").read_text()
    trained = trained_groups(run_dir, "solver")
    check_ledger(fed, trained, dropped_groups(run_dir))
    assert not untrained_batches(run_dir, "solver")
    trajs = read_trajectories(kafka)
    # every episode of every fed task arrived, once per traj_id (re-runs after a rebalance share ids)
    assert len({t.traj_id for t in trajs}) == len(fed) * GROUP
    share = {w: after[w] - before[w] for w in WORKERS}
    print(
        f"\nheterogeneous workers ({ROUTING}): {MEASURED} groups trained in {seconds:.1f} s while both "
        f"served; episodes {share}; {len(fed)} tasks fed"
    )
    assert share["slow"] >= GROUP, share  # the slow one served too
    assert share["fast"] >= 2 * share["slow"], share
