"""The feeder: deterministic tasks, JSONL input with bad lines dead-lettered, selective rollout,
and admission control against trainer progress on the real broker."""

from __future__ import annotations

import gc
import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from astraflow import gcpause
from astraflow.config import KafkaSettings
from astraflow.errors import ConfigError
from astraflow.kafka import Publisher
from astraflow.records import DeadLetter, Demonstration, Task, TaskStats, WeightVersion
from workers.feeder import Feeder, default_roles, generated_tasks, jsonl_tasks

from .conftest import make_recipe
from .kafka_util import read_topic


def test_generated_tasks_are_deterministic() -> None:
    recipe = make_recipe(feeder={"env": "guess_number", "group_size": 5, "seed": 7})
    a = [t.to_dict() | {"created_at": 0} for t in itertools.islice(generated_tasks(recipe), 20)]
    b = [t.to_dict() | {"created_at": 0} for t in itertools.islice(generated_tasks(recipe), 20)]
    assert a == b
    assert a[0]["task_id"].startswith("guess_number-s7-") and a[0]["group_size"] == 5
    assert [t["attempt"] for t in a[:10]] == [0] * 8 + [1] * 2  # 8 secrets per epoch


def test_default_roles_follow_the_workflow() -> None:
    two = make_recipe(policies=[{"name": "A"}, {"name": "B"}], feeder={"env": "referential_game"})
    assert default_roles(two, "referential_game") == {"speaker": "A", "listener": "B"}
    sv = make_recipe(policies=[{"name": "A"}, {"name": "B"}], worker={"workflow": "solve_and_verify"})
    assert default_roles(sv, "arithmetic") == {"solver": "A", "verifier": "B"}
    assert default_roles(make_recipe(), "arithmetic") == {"agent": "policy"}


def test_jsonl_bad_lines_raise_without_deadletters(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        json.dumps({"prompt": "1+1=", "payload": {"answer": "2"}}) + "\n" + json.dumps({"env": "nope"}) + "\n"
    )
    recipe = make_recipe()
    it = jsonl_tasks(recipe, path)
    first = next(it)
    assert first.task_id == "tasks-1" and first.env == "arithmetic" and first.roles == {"agent": "policy"}
    with pytest.raises(ConfigError, match=r"tasks.jsonl:2: unknown environment 'nope'"):
        next(it)


def test_admission_window_spans_the_versions_a_sample_may_lag() -> None:
    # a version every 3 steps of 2 groups, max_staleness 1: a group may be trained up to
    # (1 + 1) versions x 3 steps x 2 groups = 12 groups after it was fed
    recipe = make_recipe(max_staleness=1, trainer={"batch_groups": 2, "publish_every": 3})
    f = Feeder(recipe, Path("/nonexistent"), KafkaSettings(bootstrap="x:1"))
    f.published = 11
    assert f.admitted()
    f.published = 12
    assert not f.admitted()
    f.consumed["policy"] = 1  # one group trained (or discarded as stale) without a step yet
    assert f.admitted() and f.trainer_groups() == 1
    f.stats.put(TaskStats(task_id="t", env="arithmetic", groups=4, zero_variance_groups=4, dropped_groups=2))
    assert f.trainer_groups() == 3  # dropped groups count, zero-variance ones that were trained do not


def test_a_smaller_admission_window_holds_the_feeder_sooner() -> None:
    # the staleness bound's window is (2 + 1) x 1 x 4 = 12 groups; ahead_groups narrows it to 6
    recipe = make_recipe(max_staleness=2, trainer={"batch_groups": 4}, feeder={"ahead_groups": 6})
    f = Feeder(recipe, Path("/nonexistent"), KafkaSettings(bootstrap="x:1"))
    assert (recipe.staleness_window, recipe.admission_window) == (12, 6)
    f.published = 5
    assert f.admitted()
    f.published = 6
    assert not f.admitted()
    f.consumed["policy"] = 4  # a batch trained: four more may go
    f.published = 9
    assert f.admitted()


def test_an_admission_window_is_at_most_the_bound_and_feeds_a_batch() -> None:
    wide = make_recipe(max_staleness=2, trainer={"batch_groups": 4}, feeder={"ahead_groups": 40})
    assert wide.admission_window == 12  # the bound's: more would train stale
    with pytest.raises(ConfigError, match=r"feeder.ahead_groups 3 is below trainer.batch_groups 4"):
        make_recipe(max_staleness=2, trainer={"batch_groups": 4}, feeder={"ahead_groups": 3})


def test_selective_rollout_skips_with_a_floor() -> None:
    recipe = make_recipe(
        feeder={"selective": {"enabled": True, "min_groups": 2, "keep_fraction": 0.25, "max_skips_in_row": 3}}
    )
    f = Feeder(recipe, Path("/nonexistent"), KafkaSettings(bootstrap="x:1"))
    task = Task(task_id="t", env="arithmetic", roles={"agent": "policy"})
    assert not f.skip(task)  # no statistics yet
    f.stats.put(TaskStats(task_id="t", env="arithmetic", groups=1, success_rate=1.0))
    assert not f.skip(task)  # too few groups to trust
    f.stats.put(TaskStats(task_id="t", env="arithmetic", groups=5, success_rate=0.5))
    assert not f.skip(task)  # it teaches something
    f.stats.put(TaskStats(task_id="t", env="arithmetic", groups=5, success_rate=1.0))
    decisions = [f.skip(task) for _ in range(400)]
    assert 0.6 < sum(decisions) / 400 < 0.9  # about 1 - keep_fraction skipped
    f.skips_in_row = 3
    assert not f.skip(task)  # the floor: never more than max_skips_in_row in a row


def test_selective_rollout_may_keep_feeding_tasks_never_solved() -> None:
    """unsolved_below: None skips only what is always solved: a task whose first success needs
    exploration keeps its share of the batches."""
    sel = {"enabled": True, "min_groups": 2, "keep_fraction": 0.0, "solved_above": 0.9}
    task = Task(task_id="t", env="arithmetic", roles={"agent": "policy"})
    never = TaskStats(task_id="t", env="arithmetic", groups=5, success_rate=0.0)
    default = Feeder(
        make_recipe(feeder={"selective": sel}), Path("/nonexistent"), KafkaSettings(bootstrap="x:1")
    )
    default.stats.put(never)
    assert default.skip(task)  # never solved: skipped by default
    f = Feeder(
        make_recipe(feeder={"selective": {**sel, "unsolved_below": None}}),
        Path("/nonexistent"),
        KafkaSettings(bootstrap="x:1"),
    )
    f.stats.put(never)
    assert not f.skip(task)
    f.stats.put(TaskStats(task_id="t", env="arithmetic", groups=5, success_rate=0.95))
    assert f.skip(task)  # always solved (above 0.9) is still skipped


@pytest.mark.broker
@pytest.mark.slow
def test_admission_follows_the_slowest_trainer(kafka: KafkaSettings, topics: Any, tmp_path: Path) -> None:
    topics(["A", "B"])
    recipe = make_recipe(
        policies=[{"name": "A"}, {"name": "B"}],
        kafka=kafka.model_dump(),
        max_staleness=1,
        trainer={"batch_groups": 2},
        worker={"workflow": "solve_and_verify"},
        feeder={"env": "arithmetic", "group_size": 2, "max_tasks": 10, "poll_s": 0.1},
    )
    feeder = Feeder(recipe, tmp_path / "run", kafka)
    fed: list[int] = []
    thread = threading.Thread(target=lambda: fed.append(feeder.run()))
    thread.start()
    pub = Publisher(kafka)

    def wait_published(n: int, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and feeder.counts["published"] < n:
            time.sleep(0.05)
        time.sleep(1.0)  # give it the chance to overshoot, which it must not
        return feeder.counts["published"]

    try:
        assert wait_published(4) == 4  # window (1 + 1) x 2 = 4 groups ahead of step 0
        pub.send("weights", WeightVersion(policy="A", version=1, step=2, snapshot_uri="file:///x"), key="A")
        pub.flush()
        assert wait_published(5, timeout=3.0) == 4  # B is still at step 0: the slowest trainer decides
        pub.send("weights", WeightVersion(policy="B", version=1, step=1, snapshot_uri="file:///x"), key="B")
        pub.flush()
        assert wait_published(6) == 6  # min step 1 -> 2 groups trained -> 6 admitted
        pub.send(
            "task-stats", TaskStats(task_id="x", env="arithmetic", groups=3, zero_variance_groups=3), key="x"
        )
        pub.flush()
        assert (
            wait_published(7, timeout=3.0) == 6
        )  # zero variance alone says nothing: no filter may drop them
        pub.send(
            "task-stats",
            TaskStats(task_id="x", env="arithmetic", groups=3, zero_variance_groups=3, dropped_groups=1),
            key="x",
        )
        pub.flush()
        assert wait_published(7) == 7  # a group that reaches no trainer counts as consumed
        pub.send(
            "weights",
            WeightVersion(policy="B", version=1, step=1, groups_consumed=3, snapshot_uri="file:///x"),
            key="B",
        )
        pub.flush()
        assert wait_published(8) == 8  # B discarded a stale group: consumed without a step
        pub.send("weights", WeightVersion(policy="B", version=2, step=5, snapshot_uri="file:///x"), key="B")
        pub.flush()
        assert wait_published(10, timeout=3.0) == 9  # A (4 groups) is now the slowest: 4 + 1 + 4 = 9
        pub.send("weights", WeightVersion(policy="A", version=2, step=5, snapshot_uri="file:///x"), key="A")
        pub.flush()
    finally:
        thread.join(60)
    assert fed == [10]
    tasks = [t for t in read_topic(kafka, "tasks") if isinstance(t, Task)]
    assert len(tasks) == 10 and tasks[0].roles == {"solver": "A", "verifier": "B"}
    assert len({t.group_id for t in tasks}) == 10
    state = json.loads((tmp_path / "run" / "feeder" / "state.json").read_text())
    assert state["next"] == 10


@pytest.mark.broker
def test_jsonl_bad_lines_go_to_deadletter(kafka: KafkaSettings, topics: Any, tmp_path: Path) -> None:
    topics(["policy"])
    path = tmp_path / "t.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"task_id": "ok1", "prompt": "1+2=", "payload": {"answer": "3"}}),
                "{not json",
                json.dumps({"roles": {"agent": "ghost"}}),
                json.dumps({"task_id": "ok2", "prompt": "2+2=", "payload": {"answer": "4"}}),
            ]
        )
    )
    recipe = make_recipe(kafka=kafka.model_dump(), feeder={"admission": False})
    gcpause.pause("feed")  # as `astraflow feed` starts: the feeder turns the collector on once built
    try:
        assert Feeder(recipe, tmp_path / "run", kafka, jsonl=path).run() == 2
        assert gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
    assert [t.task_id for t in read_topic(kafka, "tasks")] == ["ok1", "ok2"] or len(
        read_topic(kafka, "tasks")
    ) == 2
    dead = [d for d in read_topic(kafka, "deadletter") if isinstance(d, DeadLetter)]
    assert sorted(d.offset for d in dead) == [2, 3]
    assert any("ghost" in d.error for d in dead) and all(str(path) in d.error for d in dead)


@pytest.mark.broker
def test_a_feeder_that_starts_a_run_writes_the_warm_ups_demonstrations_once(
    kafka: KafkaSettings, topics: Any, tmp_path: Path
) -> None:
    topics(["policy"])
    recipe = make_recipe(
        kafka=kafka.model_dump(),
        feeder={
            "env": "search",
            "env_args": {"n_entities": 4, "tool_latency_s": 0.0},
            "admission": False,
            "max_tasks": 3,
        },
        trainer={"warmup": {"steps": 1, "demonstrations": 6}},
    )
    assert Feeder(recipe, tmp_path / "run", kafka).run() == 3
    demos = read_topic(kafka, "demonstrations.policy", Demonstration)
    source = recipe.demonstration_source("policy")
    assert sorted((d.policy, d.source, d.index, d.count) for d in demos) == [
        ("policy", source, i, 6) for i in range(6)
    ]
    assert all(d.reward == 1.0 and d.loss_mask.any() for d in demos)
    # a feeder that resumes the run finds them written: nothing more (tasks go on from where it was)
    more = recipe.model_copy(update={"feeder": recipe.feeder.model_copy(update={"max_tasks": 2})})
    assert Feeder(more, tmp_path / "run", kafka).run() == 2
    assert len(read_topic(kafka, "demonstrations.policy")) == 6
    assert len(read_topic(kafka, "tasks")) == 5
