"""The stall detector of `astraflow run` on synthetic metrics: when it fires, once, and which stage
its event names (golden lines)."""

from __future__ import annotations

from astraflow.runner.collector import Instance, Snapshot
from astraflow.runner.dashboard import render
from astraflow.runner.stall import Flow, StallDetector, observe, stall_line

HUNG = Flow(
    feeder_ahead=24, window=24, episodes_in_flight=0, workers=2, tasks_lag=0, streams_lag=0, streams_pending=0
)


def test_the_chaos_hang_names_the_admission_window() -> None:
    assert stall_line("solver", 81, 95.4, HUNG) == (
        "stall: trainer solver at step 81 for 95 s; feeder blocked at ahead 24; workers idle; tasks lag 0; "
        "streams lag 0, 0 pending; suspect: the feeder's admission window (nothing is in flight anywhere)"
    )


def test_each_blocked_stage_is_named() -> None:
    cases = {
        Flow(
            feeder_ahead=10, window=24, workers=2, tasks_lag=0, streams_lag=310
        ): "feeder ahead 10; workers idle; tasks lag 0; streams lag 310, 0 pending; "
        "suspect: streams (310 trajectories not consumed)",
        Flow(
            feeder_ahead=24, window=24, workers=2, tasks_lag=12, streams_lag=0
        ): "feeder blocked at ahead 24; workers idle; tasks lag 12; streams lag 0, 0 pending; "
        "suspect: the workers (12 tasks waiting, no episode running)",
        Flow(
            feeder_ahead=24, window=24, workers=0, tasks_lag=12, streams_lag=0
        ): "feeder blocked at ahead 24; workers idle; tasks lag 12; streams lag 0, 0 pending; "
        "suspect: the workers (none reports)",
        Flow(
            feeder_ahead=20, window=24, episodes_in_flight=64, workers=4, tasks_lag=3, streams_lag=0
        ): "feeder ahead 20; workers busy (64 episodes in flight); tasks lag 3; streams lag 0, 0 pending; "
        "suspect: the workers (rollouts in progress)",
        Flow(
            feeder_ahead=24, window=24, workers=1, tasks_lag=0, streams_lag=0, streams_pending=3
        ): "feeder blocked at ahead 24; workers idle; tasks lag 0; streams lag 0, 3 pending; "
        "suspect: streams (3 trajectories wait in incomplete groups)",
        Flow(
            feeder_ahead=0, window=24, workers=1, tasks_lag=0, streams_lag=0
        ): "feeder ahead 0; workers idle; tasks lag 0; streams lag 0, 0 pending; "
        "suspect: the feeder (nothing published ahead of the trainers)",
        Flow(
            feeder_ahead=None, window=None, workers=1, tasks_lag=None, streams_lag=None
        ): "feeder silent; workers idle; tasks lag -; streams lag -, 0 pending; "
        "suspect: the trainer (samples were produced but not trained)",
    }
    for flow, want in cases.items():
        assert stall_line("p", 3, 61, flow) == f"stall: trainer p at step 3 for 61 s; {want}"


def test_a_stall_fires_after_ten_median_steps_and_at_least_a_minute_once() -> None:
    det = StallDetector()
    t = 0.0
    for step in range(0, 11):  # a step every 9 s
        assert det.update({"solver": step}, t, HUNG) == []
        t += 9.0
    # 10 x 9 s = 90 s after the last step (step 10 came at t=90)
    assert det.update({"solver": 10}, 90.0 + 89.0, HUNG) == []
    events = det.update({"solver": 10}, 90.0 + 90.5, HUNG)
    assert events == [stall_line("solver", 10, 90.5, HUNG)]
    assert det.update({"solver": 10}, 400.0, HUNG) == []  # said once
    assert det.current() == events[0] and det.stalled() == ["solver"]
    assert det.update({"solver": 11}, 410.0, HUNG) == ["stall over: trainer solver at step 11 after 320 s"]
    assert det.current() is None


def test_fast_steps_still_wait_a_minute_and_a_finished_trainer_is_no_stall() -> None:
    det = StallDetector()
    for step in range(5):
        det.update({"a": step, "b": step}, step * 1.0, HUNG)  # a step a second: 10x is 10 s
    assert det.update({"a": 4, "b": 4}, 4.0 + 59.0, HUNG) == []
    fired = det.update({"a": 4, "b": 4}, 4.0 + 60.0, HUNG, done=frozenset({"b"}))
    assert [e.split(";")[0] for e in fired] == ["stall: trainer a at step 4 for 60 s"]


def test_no_first_step_for_ten_minutes_is_a_stall() -> None:
    det = StallDetector()
    assert det.update({"solver": 0}, 0.0, HUNG) == []
    assert det.update({"solver": 0}, 599.0, HUNG) == []
    assert det.update({"solver": 0}, 600.0, HUNG)[0].startswith("stall: trainer solver at step 0 for 600 s")


def _inst(component: str, id_: str, values: dict[str, float]) -> Instance:
    return Instance(component, id_, "local", 0.0, 0, values)


def test_observed_from_a_snapshot_and_shown_on_the_dashboard() -> None:
    snap = Snapshot(lag={"tasks": 0, "trajectories": 0})
    for inst in (
        _inst("trainer", "trainer.solver", {"step": 81}),
        _inst("feeder", "feeder", {"feeder.ahead": 24}),
        _inst("worker", "w0", {"worker.in_flight": 0}),
        _inst("worker", "w1", {"worker.in_flight": 0}),
        _inst("streams", "s0", {"trajectories.pending": 0}),
    ):
        snap.instances[(inst.component, inst.id)] = inst
    steps, flow = observe(snap, ["solver", "verifier"], window=24)
    assert steps == {"solver": 81, "verifier": 0} and flow == HUNG
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(render(snap, ["solver"], "run", stall=stall_line("solver", 81, 95, flow)))
    assert "stall: trainer solver at step 81 for 95 s; feeder blocked at ahead 24" in console.export_text()
