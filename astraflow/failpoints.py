"""Fault injection by environment variable, for the fault tests (tests/faults) and `make chaos`.

`ASTRAFLOW_TRAINER_FAILPOINT=mid_step:5,mid_checkpoint:8,mid_publication:12` makes a trainer
SIGKILL itself at those points of those steps, where random timing would rarely land:
- mid_step: the optimiser stepped, the batch is not yet in the trained ledger or any checkpoint;
- mid_checkpoint: the checkpoint's files are written to its temporary directory, not renamed;
- mid_publication: the version is in the weight store, neither checkpointed nor announced.
Each fires once per run directory (a marker file is written first): the restarted trainer
resumes from an earlier checkpoint, trains the same step again and must then go past it.
(The feeder's and streams' older failpoints, ASTRAFLOW_FEEDER_FAILPOINT and
ASTRAFLOW_STREAMS_FAILPOINT, fire in every process instead; see their docstrings.)
`ASTRAFLOW_WORKER_FAILPOINT=episode_delay_ms:N` slows every episode of a worker (`episode_delay_s`).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from astraflow.errors import ConfigError

log = logging.getLogger(__name__)

TRAINER_ENV = "ASTRAFLOW_TRAINER_FAILPOINT"


def armed(env: str) -> set[tuple[str, int]]:
    """The (where, n) pairs named in environment variable `env` (`where:n[,where:n...]`)."""
    out = set()
    for item in os.environ.get(env, "").split(","):
        where, _, n = item.strip().partition(":")
        if where and n.isdigit():
            out.add((where, int(n)))
    return out


def hit(env: str, where: str, n: int, marker_dir: Path) -> None:
    """SIGKILL this process if `where:n` is armed in `env` and has not fired in `marker_dir` yet."""
    if (where, n) not in armed(env):
        return
    marker = Path(marker_dir) / f"failpoint-{where}-{n}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    with open(marker, "w") as fh:
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        os.fsync(fh.fileno())
    log.warning("failpoint %s:%d: SIGKILL", where, n)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


def episode_delay_s() -> float:
    """Fault injection for the elasticity tests (ASTRAFLOW_WORKER_FAILPOINT=episode_delay_ms:N): every
    episode holds its slot N ms longer, as on a slower machine; the sleep costs no CPU, so several
    slowed workers fit on two cores. Test-only: unset, there is no delay."""
    where, _, n = os.environ.get("ASTRAFLOW_WORKER_FAILPOINT", "").partition(":")
    if not where:
        return 0.0
    if where != "episode_delay_ms" or not n.isdigit():
        raise ConfigError(
            f"ASTRAFLOW_WORKER_FAILPOINT={where}:{n}: the one failpoint is episode_delay_ms:<int>"
        )
    return int(n) / 1000.0
