"""The scaling advice on synthetic runs: each regime built from metric rows as the components write
them (cumulative counters every few seconds), measured and classified, with the sentence checked
word for word. Then the places that print it: the run summary and `astraflow status`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from astraflow.runner.advice import Observed, advise, counter, measure, more_workers, rows_from_history
from astraflow.runner.collector import Instance, Snapshot
from astraflow.runner.report import summarize, summary_text, write_report
from astraflow.runner.status import status_panel
from tests.e2e.metric_rows import SPAN, STEP_TOKENS, feeder, lag, row, streams, trainer, workers


def advice_of(rows: list[dict[str, Any]], **kw: Any) -> Any:
    return advise(measure(rows, **kw))


# ------------------------------------------------------------------------------ the regimes


def test_trainer_bound_workers_idle() -> None:
    # a slow trainer: the feeder's window is full, so the workers have 1 task's episodes out of 4
    a = advice_of(trainer(0.02) + workers(2, in_flight=6.4) + feeder(0.9) + streams(20.0))
    assert a.regime == "trainer-bound"
    assert a.line == (
        "trainer-bound: workers idle 80%; the trainer waited 2%, the feeder held back 90%. "
        "A faster trainer (GPU, more DDP ranks) speeds the run; more workers would not"
    )


def test_rollout_bound_says_how_many_workers_would_fill_the_trainer() -> None:
    # the trainer trains 40% of the time: 2 workers feed it; 2 / 0.4 = 5 would keep it busy
    a = advice_of(trainer(0.6) + workers(2, in_flight=32) + feeder(0.7) + streams(20.0))
    assert (a.regime, a.more_workers) == ("rollout-bound", 3)
    assert a.line == (
        "rollout-bound: about 3 more workers would keep the trainer busy "
        "(the trainer waited 60%, 2 workers idle 0%)"
    )


def test_streams_bound_when_the_trajectories_backlog_grows() -> None:
    # workers write 20/s, the lag on trajectories grows 100 -> 1300 in 60 s: streams takes 0 net
    a = advice_of(trainer(0.7) + workers(2, in_flight=32) + feeder(0.2) + streams(0.0) + lag(100, 1300))
    assert a.regime == "streams-bound"
    assert a.line.startswith(
        "streams-bound: the trajectories lag grows by 20.0 records/s (now 1300) while the trainer waited 70%"
    )


def test_streams_bound_from_the_rates_when_no_lag_was_sampled() -> None:
    # `astraflow status` samples lag for a few seconds only: workers write 20/s, streams take 8/s
    obs = measure(trainer(0.7) + workers(2, in_flight=32) + streams(8.0))
    assert obs.backlog_growth_per_s == pytest.approx(12.0) and obs.trajectories_per_s == pytest.approx(20.0)
    assert advise(obs).regime == "streams-bound"
    # a backlog that grows by less than a tenth of what the workers write is noise: rollout-bound then
    assert advice_of(trainer(0.7) + workers(2, in_flight=32) + streams(19.0)).regime == "rollout-bound"


def test_admission_bound_when_the_window_is_all_in_flight() -> None:
    a = advice_of(trainer(0.5) + workers(2, in_flight=3.2) + feeder(0.95) + streams(20.0))
    assert a.regime == "admission-bound"
    assert a.line.startswith(
        "admission-bound: the trainer waited 50% and workers idle 90% while the feeder was held back 95%"
    )
    assert "raise feeder.ahead_groups where set, else max_staleness or trainer.publish_every" in a.line


def test_feeder_bound_when_nothing_holds_the_feeder_back() -> None:
    a = advice_of(trainer(0.5) + workers(2, in_flight=3.2) + feeder(0.0) + streams(20.0))
    assert a.regime == "feeder-bound"
    assert a.line.startswith(
        "feeder-bound: the trainer waited 50% and workers idle 90% while the feeder was "
        "held back 0%: the task source is the limit"
    )


def test_balanced() -> None:
    a = advice_of(trainer(0.1) + workers(3, in_flight=28.8) + feeder(0.6) + streams(30.0))
    assert a.regime == "balanced"
    assert a.line == "balanced: the trainer waited 10%, workers idle 10%; scale trainers and workers together"


def test_unknown_before_two_trainer_steps() -> None:
    a = advice_of(trainer(0.5, until=0) + workers(2, in_flight=32))
    assert a.regime == "unknown" and a.line.startswith("unknown: no trainer has reported steps over 10 s")
    # three steps in the last 0.7 s (a restarted trainer) say nothing either
    restarted = [{**r, "time": r["time"] + SPAN - 0.7} for r in trainer(0.0, every_s=0.35, until=0.7)]
    assert advice_of(restarted + workers(2, in_flight=32)).regime == "unknown"
    assert advise(Observed(window_s=0.0)).regime == "unknown"


def test_no_workers_is_rollout_bound() -> None:
    a = advice_of(trainer(0.9) + feeder(0.9))
    assert a.regime == "rollout-bound" and "no worker reported" in a.line


def test_unknown_when_the_feeder_has_not_reported() -> None:
    a = advice_of(trainer(0.5) + workers(2, in_flight=3.2))
    assert a.regime == "unknown" and "the feeder has not reported twice" in a.line


def test_a_small_backlog_is_not_streams_bound() -> None:
    # grows 0.5 records/s for 60 s (30 records, a few groups): with workers busy that is rollout-bound
    a = advice_of(trainer(0.7) + workers(1, in_flight=32, trajectories_per_s=1.0) + feeder(0.2) + lag(0, 30))
    assert a.regime == "rollout-bound"


def test_a_worker_starting_late_is_no_backlog() -> None:
    # streams reads 20/s from t=25 on, all along; the one worker first reports at t=30 and writes
    # 20/s. Rates over each one's own span (20/s against 700 in 60 s) would see a backlog of 8/s.
    worker = [
        row(
            "worker",
            "worker-0",
            t,
            {
                "worker.trajectories": 20.0 * (t - 25),
                "worker.episode_s": 32.0 * t,
                "worker.max_episodes": 32.0,
            },
        )
        for t in range(30, SPAN + 1, 5)
    ]
    reader = [
        row("streams", "streams-0", t, {"trajectories.in": 20.0 * max(0, t - 25)})
        for t in range(0, SPAN + 1, 5)
    ]
    obs = measure(trainer(0.7) + worker + reader + feeder(0.2))
    assert obs.backlog_growth_per_s == pytest.approx(0.0)
    assert advise(obs).regime == "rollout-bound"


def test_the_busiest_of_two_trainers_decides() -> None:
    # the speaker trains 95% of the time, the listener 40%: the speaker bounds the run
    rows = trainer(0.05, "speaker") + trainer(0.6, "listener") + workers(2, in_flight=6.4) + feeder(0.9)
    obs = measure(rows)
    assert obs.trainer_wait == pytest.approx({"speaker": 0.05, "listener": 0.6})
    a = advise(obs)
    assert a.regime == "trainer-bound" and "trainer speaker waited 5%" in a.line


# ------------------------------------------------------------------------------ measuring


def test_more_workers_golden() -> None:
    assert more_workers(2, 0.6) == (3, False)  # 2 / 0.4 = 5
    assert more_workers(4, 0.5) == (4, False)  # 4 / 0.5 = 8
    assert more_workers(3, 0.3) == (2, False)  # 3 / 0.7 = 4.29 -> 5
    assert more_workers(1, 0.99) == (9, True)  # capped at 90% waiting: 1 / 0.1 = 10, at least
    assert more_workers(5, 0.26) == (2, False)  # 5 / 0.74 = 6.76 -> 7


def test_a_counter_is_read_from_its_baseline_in_its_latest_process() -> None:
    rs = [
        row("feeder", "feeder", t, {"feeder.blocked_s": v})
        for t, v in ((0, 0.0), (5, 4.0), (10, 9.0), (15, 1.0), (20, 6.0), (25, 11.0))
    ]
    assert counter(rs, "feeder.blocked_s", start=22) == [(20, 6.0), (25, 11.0)]  # from the report before 22
    assert counter(rs, "feeder.blocked_s", start=7) == [(15, 1.0), (20, 6.0), (25, 11.0)]  # restarted at 15
    assert counter(rs, "feeder.blocked_s", start=-1) == [(15, 1.0), (20, 6.0), (25, 11.0)]


def test_a_restarted_trainer_is_measured_from_its_new_process() -> None:
    # waited 90% before a restart at t=30, 60% since: the gap and the old process do not count
    before = [r for r in trainer(0.9) if r["time"] < 25]
    after = [
        {**r, "values": {**r["values"], "wait_s": r["values"]["wait_s"] - 18.0}}
        for r in trainer(0.6)
        if r["time"] >= 30
    ]
    obs = measure(before + after + workers(2, in_flight=32) + feeder(0.5))
    assert obs.trainer_wait["solver"] == pytest.approx(0.6)


def test_a_bursty_trainer_counts_the_wait_before_its_first_step_in_the_window() -> None:
    # waits 20 s, then trains 10 steps in 4 s, twice. A window from t=28 sees only the second
    # burst's steps, whose wait_s carries the 20 s waited since the last report before it (t=24).
    rows, waited = [], 0.0
    for burst in range(2):
        t0 = burst * 24.0
        waited += 20.0
        for k in range(10):
            rows.append(
                row(
                    "trainer",
                    "trainer.solver",
                    t0 + 20.4 + 0.4 * k,
                    {"wait_s": waited, "batch.tokens": STEP_TOKENS, "tokens_per_s": STEP_TOKENS / 0.4},
                    step=burst * 10 + k + 1,
                )
            )
    obs = measure(rows, window_s=20)
    assert obs.trainer_wait["solver"] == pytest.approx(20.0 / (48.0 - 24.0))
    assert obs.trainer_steps_per_s["solver"] == pytest.approx(10 / (48.0 - 24.0))


def test_wait_from_step_times_when_the_trainer_does_not_report_it() -> None:
    obs = measure(trainer(0.6, with_wait_s=False) + workers(2, in_flight=32))
    assert obs.trainer_wait["solver"] == pytest.approx(0.6) and obs.wait_source == "step times"
    a = advise(obs)
    assert a.regime == "rollout-bound" and "the trainer waited 60% (from step times)" in a.line


def test_a_silent_trainer_is_waiting() -> None:
    # busy for 20 s, then no step for 40 s while the workers keep reporting: it starved
    obs = measure(trainer(0.0, until=20) + workers(2, in_flight=32))
    assert obs.trainer_wait["solver"] == pytest.approx((40 - 1) / 60)  # the tail minus one step in progress


def test_the_window_keeps_only_recent_rows() -> None:
    # waiting 90% for the first 30 s, 10% since: the last 20 s are balanced
    early = [r for r in trainer(0.9) if r["time"] < 30]
    late = [
        {**r, "values": {**r["values"], "wait_s": early[-1]["values"]["wait_s"] + 0.1 * (r["time"] - 29)}}
        for r in trainer(0.1)
        if r["time"] >= 30
    ]
    obs = measure(early + late + workers(2, in_flight=30), window_s=20)
    assert obs.window_s == 20 and obs.trainer_wait["solver"] == pytest.approx(0.1)


def test_the_start_up_before_the_first_trainer_step_is_left_out() -> None:
    # models load for 30 s: the feeder's window is full and the workers idle; then it is rollout-bound
    late = [{**r, "time": r["time"] + 30} for r in trainer(0.6, until=30)]
    start_up = [row("feeder", "feeder", t, {"feeder.blocked_s": float(t)}) for t in range(0, 30, 5)]
    after = [
        row("feeder", "feeder", t, {"feeder.blocked_s": 30.0 + 0.2 * (t - 30)})
        for t in range(30, SPAN + 1, 5)
    ]
    idle_then_busy = [
        row(
            "worker",
            f"worker-{i}",
            t,
            {"worker.episode_s": 32.0 * max(0, t - 30), "worker.max_episodes": 32.0},
        )
        for i in range(2)
        for t in range(0, SPAN + 1, 5)
    ]
    obs = measure(late + start_up + after + idle_then_busy)
    assert (
        obs.window_s == 30
        and obs.feeder_blocked == pytest.approx(0.2)
        and obs.workers_idle == pytest.approx(0.0)
    )
    assert advise(obs).regime == "rollout-bound"


def test_workers_idle_from_episode_seconds_not_from_the_moments_they_report() -> None:
    # 29 episodes on average, but each report fell on a moment with none in flight
    rows = [{**r, "values": {**r["values"], "worker.in_flight": 0.0}} for r in workers(2, in_flight=28.8)]
    assert measure(trainer(0.1) + rows).workers_idle == pytest.approx(0.1)
    # older metrics without episode_s: the in-flight samples are all there is
    gauges = [
        {**r, "values": {k: v for k, v in r["values"].items() if k != "worker.episode_s"}}
        for r in workers(2, in_flight=24)
    ]
    assert measure(trainer(0.1) + gauges).workers_idle == pytest.approx(0.25)


def test_workers_without_max_episodes_use_the_given_limit() -> None:
    rows = [
        {
            **r,
            "values": {
                k: v for k, v in r["values"].items() if k not in ("worker.max_episodes", "worker.episode_s")
            },
        }
        for r in workers(2, in_flight=8)
    ]
    assert measure(trainer(0.1) + rows, max_episodes=32).workers_idle == pytest.approx(0.75)
    assert measure(trainer(0.1) + rows, max_episodes=8).workers_idle == pytest.approx(0.0)


# ------------------------------------------------------------------------------ where it is printed


def test_the_run_summary_states_the_advice(tmp_path: Path) -> None:
    rows = trainer(0.6) + workers(2, in_flight=32) + feeder(0.7) + streams(20.0) + lag(5, 5)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    warm = {
        "warmup.steps": 100.0,
        "warmup.loss_first": 3.0,
        "warmup.loss_last": 0.114,
        "warmup.seconds": 21.4,
    }
    (tmp_path / "trainer" / "solver").mkdir(parents=True)
    (tmp_path / "trainer" / "solver" / "warmup.json").write_text(json.dumps(warm))
    summary = write_report(tmp_path, {"recipe": "synthetic"})
    assert summary["policies"]["solver"]["warmup"] == warm
    assert summary["scaling"]["regime"] == "rollout-bound" and summary["scaling"]["more_workers"] == 3
    assert summary["scaling"]["window_s"] == 30.0  # the second half of the trainer's steps
    text = (tmp_path / "summary.txt").read_text()
    assert "scaling: rollout-bound: about 3 more workers would keep the trainer busy" in text
    assert "warm-up 100 supervised steps on demonstrations, loss 3.000 -> 0.114 (21 s)" in text
    assert json.loads((tmp_path / "summary.json").read_text())["scaling"]["regime"] == "rollout-bound"


def test_the_summary_measures_the_second_half_and_ends_with_the_trainers() -> None:
    # warm-up: the trainer waited 100% of the first half; after the trainers stop, the workers idle
    # during shutdown for 30 s: neither is what bounded the run, which was the trainer
    steady = [r for r in trainer(0.02) if r["time"] >= 30]
    first = [
        row(
            "trainer",
            "trainer.solver",
            0.0,
            {"step": 1.0, "wait_s": 0.0, "batch.tokens": STEP_TOKENS, "tokens_per_s": STEP_TOKENS / 0.98},
            step=1,
        )
    ]
    steady = [{**r, "values": {**r["values"], "wait_s": 29.0 + r["values"]["wait_s"] - 0.6}} for r in steady]
    shutdown = [
        row("worker", "worker-0", t, {"worker.in_flight": 0.0, "worker.max_episodes": 32.0})
        for t in range(61, 90, 5)
    ]
    summary = summarize(first + steady + workers(2, in_flight=6.4) + feeder(0.9) + shutdown)
    assert summary["scaling"]["regime"] == "trainer-bound", summary["scaling"]
    assert summary_text(summary).splitlines()[-1].startswith("scaling: trainer-bound: workers idle 80%")


def test_status_prints_the_advice() -> None:
    rows = trainer(0.6) + workers(2, in_flight=32) + feeder(0.7)
    history: dict[tuple[str, str], list[tuple[int, float, dict[str, float]]]] = {}
    for r in rows:
        history.setdefault((r["component"], r["id"]), []).append((r["step"], r["time"], r["values"]))
    assert sorted(rows_from_history(history), key=lambda r: (r["time"], r["id"])) == sorted(
        [{k: v for k, v in r.items() if k != "region"} for r in rows], key=lambda r: (r["time"], r["id"])
    )
    snap = Snapshot(
        instances={
            ("trainer", "trainer.solver"): Instance(
                "trainer", "trainer.solver", "local", 60.0, 61, rows[-1]["values"]
            )
        }
    )
    console = Console(record=True, width=200)
    console.print(status_panel(snap, history, ["solver"], "astraflow status (test)", max_episodes=32))
    out = console.export_text()
    assert "scaling: rollout-bound: about 3 more workers would keep the trainer busy" in out


def test_the_collectors_history_keeps_only_its_last_ten_minutes() -> None:
    """Unbounded, the history grew ~7 MiB every 10 minutes of a run (bench/soak.py)."""
    from astraflow.config import KafkaSettings
    from astraflow.runner.collector import HISTORY_S, MetricsCollector

    collector = MetricsCollector(KafkaSettings())  # nothing connects before start()
    for t in range(0, 3600, 5):
        collector._remember(("trainer", "trainer.solver"), (t // 5, 1000.0 + t, {"reward.mean": 0.5}))
    kept = collector.history()[("trainer", "trainer.solver")]
    assert kept[-1][1] == 1000.0 + 3595 and kept[0][1] >= 1000.0 + 3595 - HISTORY_S
    assert len(kept) == HISTORY_S // 5 + 1
