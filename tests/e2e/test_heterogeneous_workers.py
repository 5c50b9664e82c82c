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

import time
from pathlib import Path

import pytest

from tests.e2e.helpers import wait_for
from tests.e2e.outside import GROUP, episodes_now, outside_recipe, outside_run

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.slow]

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
    recipe = outside_recipe(tmp_path, feeder={"routing": ROUTING})
    with outside_run(recipe, tmp_path, kafka_bootstrap) as run:
        for w, (episodes, delay_ms) in WORKERS.items():
            run.add_worker(w, episodes, delay_ms)
        # both in the group (each has rolled out a task): the split is measured from here
        wait_for(lambda: set(WORKERS) <= set(episodes_now(run.kafka)), 900, "both workers to roll out a task")
        before, t0 = episodes_now(run.kafka), time.monotonic()
        start = run.trained()
        wait_for(lambda: run.trained() >= start + MEASURED, 600, f"{MEASURED} groups trained by the pair")
        after, seconds = episodes_now(run.kafka), time.monotonic() - t0
        fed = run.drain()  # no more tasks; everything fed must come out of the loop
    run.check(fed)
    share = {w: after[w] - before[w] for w in WORKERS}
    print(
        f"\nheterogeneous workers ({ROUTING}): {MEASURED} groups trained in {seconds:.1f} s while both "
        f"served; episodes {share}; {len(fed)} tasks fed"
    )
    assert share["slow"] >= GROUP, share  # the slow one served too
    assert share["fast"] >= 2 * share["slow"], share
