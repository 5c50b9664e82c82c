"""Synthetic metrics.jsonl rows of a run (tests/e2e/test_advice.py): a trainer, workers, the feeder,
streams and the trajectories' lag over SPAN seconds, reporting cumulative counters every few seconds as
the components do."""

from __future__ import annotations

from typing import Any

SPAN = 60  # seconds of synthetic run
STEP_TOKENS = 1000.0


def row(component: str, rid: str, t: float, values: dict[str, float], step: int = -1) -> dict[str, Any]:
    return {
        "component": component,
        "id": rid,
        "region": "local",
        "time": float(t),
        "step": step,
        "values": values,
    }


def trainer(
    wait: float, policy: str = "solver", every_s: float = 1.0, until: float = SPAN, with_wait_s: bool = True
) -> list[dict[str, Any]]:
    """A trainer stepping every `every_s` seconds, waiting `wait` of each interval for data and
    training the rest (tokens_per_s says how long the step took, as the engine measures it)."""
    step_s = every_s * (1.0 - wait)
    rows = []
    for k in range(int(until / every_s) + 1):
        values = {"step": float(k + 1), "batch.tokens": STEP_TOKENS, "tokens_per_s": STEP_TOKENS / step_s}
        if with_wait_s:
            values["wait_s"] = wait * every_s * k
        rows.append(row("trainer", f"trainer.{policy}", k * every_s, values, step=k + 1))
    return rows


def workers(
    n: int, in_flight: float, max_episodes: int = 32, trajectories_per_s: float = 10.0
) -> list[dict[str, Any]]:
    """Workers with `in_flight` episodes on average (episode_s grows by it each second)."""
    return [
        row(
            "worker",
            f"worker-{i}",
            t,
            {
                "worker.in_flight": in_flight,
                "worker.max_episodes": float(max_episodes),
                "worker.episode_s": in_flight * t,
                "worker.trajectories": trajectories_per_s * t,
            },
        )
        for i in range(n)
        for t in range(0, SPAN + 1, 5)
    ]


def feeder(blocked: float) -> list[dict[str, Any]]:
    return [row("feeder", "feeder", t, {"feeder.blocked_s": blocked * t}) for t in range(0, SPAN + 1, 5)]


def streams(taken_per_s: float) -> list[dict[str, Any]]:
    return [
        row("streams", "streams-0", t, {"trajectories.in": taken_per_s * t}) for t in range(0, SPAN + 1, 5)
    ]


def lag(first: float, last: float) -> list[dict[str, Any]]:
    return [
        row("collector", "lag", t, {"lag.tasks": 0.0, "lag.trajectories": first + (last - first) * t / SPAN})
        for t in range(0, SPAN + 1, 3)
    ]
