"""The feeder resumes exactly: killed between two position saves, it publishes no task twice;
its task statistics stay bounded by `max_task_stats` while the dropped-group total stays exact."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

import pytest

from astraflow.config import KafkaSettings
from astraflow.records import Task, TaskStats
from workers.feeder import Feeder, generated_tasks
from workers.feeder_state import StatsCache

from .conftest import make_recipe
from .kafka_util import read_topic


def test_task_statistics_stay_bounded_and_dropped_groups_stay_counted() -> None:
    cache = StatsCache(max_tasks=100)
    for i in range(10_000):  # 100x the bound
        cache.put(TaskStats(task_id=f"t{i}", env="arithmetic", groups=1, dropped_groups=i % 2))
    assert len(cache) == 100 and cache.evicted == 9_900
    assert cache.dropped == 5_000  # evicted tasks' drops still count as consumed
    assert cache.get("t0") is None and cache.get("t9999").dropped_groups == 1
    cache.put(TaskStats(task_id="t9999", env="arithmetic", groups=2, dropped_groups=3))  # cumulative
    assert cache.dropped == 5_002 and len(cache) == 100
    cache.put(TaskStats(task_id="t9999", env="arithmetic", groups=1, dropped_groups=1))  # streams reset it
    assert cache.dropped == 5_003
    cache.put(TaskStats(task_id="t9901", env="arithmetic", groups=1))  # refreshed: now the newest
    cache.put(TaskStats(task_id="new", env="arithmetic", groups=1))
    assert cache.get("t9901") is not None and cache.get("t9900") is None  # least recently updated went


def test_a_feeder_reports_its_bounded_statistics() -> None:
    recipe = make_recipe(feeder={"max_task_stats": 3})
    f = Feeder(recipe, Path("/nonexistent"), KafkaSettings(bootstrap="x:1"))
    for i in range(50):
        f.stats.put(TaskStats(task_id=f"t{i}", env="arithmetic", groups=1, dropped_groups=1))
    assert len(f.stats) == 3 and f.stats.evicted == 47 and f.trainer_groups() == 50


def _ids(recipe: Any, n: int) -> list[str]:
    return [t.group_id for t in itertools.islice(generated_tasks(recipe), n)]


@pytest.mark.broker
def test_a_feeder_killed_between_saves_publishes_no_task_twice(
    kafka: KafkaSettings, topics: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topics(["policy"])
    run_dir = tmp_path / "run"
    state = run_dir / "feeder" / "state.json"
    saved_at_64 = tmp_path / "state64.json"
    real_save = Feeder._save_position

    def save(self: Feeder, position: int) -> None:
        real_save(self, position)
        if position == 64:
            shutil.copy(state, saved_at_64)

    monkeypatch.setattr(Feeder, "_save_position", save)
    first = make_recipe(
        kafka=kafka.model_dump(), feeder={"env": "arithmetic", "admission": False, "max_tasks": 70}
    )
    assert Feeder(first, run_dir, kafka).run() == 70
    # a SIGKILL after the 70th task: the final save never happened, the last one is at 64
    shutil.copy(saved_at_64, state)
    again = make_recipe(
        kafka=kafka.model_dump(), feeder={"env": "arithmetic", "admission": False, "max_tasks": 60}
    )
    feeder = Feeder(again, run_dir, kafka)
    assert feeder.run() == 60
    assert feeder.counts["resume_skipped"] == 6  # tasks 65..70 were on the topic already
    tasks = [t.group_id for t in read_topic(kafka, "tasks") if isinstance(t, Task)]
    assert len(tasks) == 130 and len(set(tasks)) == 130
    assert set(tasks) == set(_ids(first, 130))  # exactly the source's first 130, none skipped

    # killed before its first save: no state at all, every task on the topic is checked
    state.unlink()
    feeder = Feeder(
        again.model_copy(update={"feeder": again.feeder.model_copy(update={"max_tasks": 5})}), run_dir, kafka
    )
    assert feeder.run() == 5 and feeder.counts["resume_skipped"] == 130
    tasks = [t.group_id for t in read_topic(kafka, "tasks") if isinstance(t, Task)]
    assert len(tasks) == 135 and set(tasks) == set(_ids(first, 135))


@pytest.mark.broker
def test_a_sigkilled_astraflow_feed_resumes_without_duplicates(
    kafka: KafkaSettings, topics: Any, tmp_path: Path
) -> None:
    import subprocess
    import sys

    import yaml

    from ..conftest import subprocess_env
    from .conftest import TINY

    topics(["policy"])
    data = {
        "name": "resume",
        "model": dict(TINY),
        "kafka": kafka.model_dump(exclude_none=True),
        "feeder": {"env": "arithmetic", "admission": False},
    }
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data))
    cmd = [
        sys.executable,
        "-m",
        "astraflow.cli",
        "feed",
        "--recipe",
        str(recipe),
        "--run-dir",
        str(tmp_path / "run"),
    ]
    killed = subprocess.run(
        cmd,
        env=subprocess_env(ASTRAFLOW_FEEDER_FAILPOINT="after_publish:70"),
        capture_output=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]  # SIGKILL after 70, saved at 64
    again = subprocess.run(
        [*cmd, "--max-tasks", "58"], env=subprocess_env(), capture_output=True, timeout=300
    )
    assert again.returncode == 0 and b"fed 58 tasks" in again.stderr, again.stderr.decode()[-2000:]
    tasks = [t.group_id for t in read_topic(kafka, "tasks") if isinstance(t, Task)]
    assert len(tasks) == 128 and len(set(tasks)) == 128  # none published twice
    assert set(tasks) == set(_ids(make_recipe(feeder={"env": "arithmetic"}), 128))
