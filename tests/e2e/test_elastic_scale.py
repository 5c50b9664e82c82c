"""Elastic rollout at scale, as users run it: `astraflow run` with no workers of its own, and rollout
workers (`astraflow worker`) started and stopped from outside while it runs: 1 -> 6 -> 2. The last
two are unlike (max_episodes 4 vs 1, the second's episodes twice as long). At the end, with the
feeder stopped, the ledger: every task fed was trained exactly once or counted as dropped under a
reason, and every episode arrived. Printed, not asserted: each worker's trajectories and the
partitions' rebalance pauses (bench/RESULTS.md, "Elastic workers"). That the fast worker of the pair
does more, since the feeder routes tasks to the partitions with the least work outstanding, is
asserted by tests/e2e/test_heterogeneous_workers.py.

Episodes are paced by the test-only failpoint ASTRAFLOW_WORKER_FAILPOINT=episode_delay_ms:N (a
sleep, no CPU), so that six workers fit on two cores and the run outlasts the scaling."""

from __future__ import annotations

import collections
import datetime
import re
import statistics
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import wait_for
from tests.e2e.outside import episodes_now, outside_recipe, outside_run, stop

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.slow]

#: worker -> (worker.max_episodes, episode delay in ms): up to (episodes / delay) episodes per second;
#: `fast` and `slow`, the pair that stays, differ 8-fold.
WORKERS = {
    "w0": (1, 1000),
    "w1": (2, 1000),
    "w2": (2, 1000),
    "w3": (2, 1000),
    "fast": (4, 500),
    "slow": (1, 1000),
}


LINE = re.compile(
    r"^(\S+ \S+) INFO workers\.worker: worker (\S+) (assigned|revoked|stopping)(?: \[([\d, ]*)\])?"
    r"(?: \(released (\d+) tasks\))?"
)


def partition_moves(run_dir: Path) -> tuple[list[float], int]:
    """From the workers' logs: for each partition that changed hands, seconds from the moment its
    owner stopped taking its tasks (revocation, or SIGTERM: a stopping worker pauses its partitions
    while it drains) to its next assignment (the rebalance pause of that partition); and the tasks
    released to be re-run."""
    events: list[tuple[datetime.datetime, str, str, list[int]]] = []
    released = 0
    for log in run_dir.glob("outside-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            m = LINE.match(line)
            if m:
                when = datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f")
                events.append((when, m[2], m[3], [int(p) for p in (m[4] or "").split(",") if p.strip()]))
                released += int(m[5] or 0)
    events.sort()
    held: dict[str, set[int]] = collections.defaultdict(set)
    idle_since: dict[int, datetime.datetime] = {}
    gaps = []
    for when, worker, what, parts in events:
        if what == "stopping":
            for p in held[worker]:
                idle_since.setdefault(p, when)
        for p in parts:
            if what == "revoked":
                held[worker].discard(p)
                idle_since.setdefault(p, when)
            else:
                held[worker].add(p)
                if p in idle_since:
                    gaps.append((when - idle_since.pop(p)).total_seconds())
    return gaps, released


@pytest.mark.timeout(1800)  # about 4 minutes on an idle 2-core machine; a shared one is slower
def test_workers_scale_1_to_6_to_2_mid_run_and_nothing_is_lost(kafka_bootstrap: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    recipe = outside_recipe(tmp_path, max_episodes=2)
    with outside_run(recipe, tmp_path, kafka_bootstrap) as run:
        marks["run up"] = time.monotonic() - t0
        # 1: one worker
        run.add_worker("w0", *WORKERS["w0"])
        wait_for(lambda: run.trained() >= 2, 600, "two groups trained with one worker")
        marks["1 worker"] = time.monotonic() - t0
        # 2: six workers
        for w in WORKERS:
            if w not in run.procs:
                run.add_worker(w, *WORKERS[w])
        wait_for(
            lambda: set(WORKERS) <= set(episodes_now(run.kafka)),
            900,
            "every one of six workers to roll out a task",
        )
        marks["6 workers each rolled out"] = time.monotonic() - t0
        # 3: back to two, the unlike pair
        stop(run.procs, ["w0", "w1", "w2", "w3"], run.run_dir)
        marks["down to 2"] = time.monotonic() - t0
        at_two = run.trained()
        before = episodes_now(run.kafka)
        wait_for(lambda: run.trained() >= at_two + 8, 600, "8 groups trained by the pair")
        # 4: no more tasks; everything fed must come out of the loop
        at_stop = episodes_now(run.kafka)
        fed = run.drain()
        marks["all accounted"] = time.monotonic() - t0
    trajs = run.check(fed)
    episodes = collections.Counter(t.worker_id for t in trajs)
    pair = {w: episodes[w] - before[w] for w in ("fast", "slow")}
    fed_pair = {w: at_stop[w] - before[w] for w in ("fast", "slow")}  # before the drain
    gaps, released = partition_moves(run.run_dir)
    print(
        f"\nelastic scale: {len(fed)} tasks; {marks}; trained before the scale-down {at_two}; trajectories "
        f"per worker {dict(episodes)}, by the pair after it {pair} ({fed_pair} until the feeder "
        f"stopped); {len(gaps)} partition moves, paused -> assigned s: median "
        f"{statistics.median(gaps) if gaps else 0:.2f}, max {max(gaps, default=0):.2f}; "
        f"{released} tasks released to be re-run"
    )
    assert all(episodes[w] > 0 for w in WORKERS), episodes
