"""Metric publication: every component reports what it does to the `metrics` topic.

A `MetricsReporter` batches named values and publishes one Metric record per `report()` call;
the dashboard and the run report read them back. Names are dotted (`stage.validate.in`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import ClassVar

from astraflow.kafka import Publisher
from astraflow.records import Metric
from astraflow.topics import METRICS


@dataclass(eq=False)
class MetricsReporter:
    """Publishes Metric records for one component instance."""

    TOPIC: ClassVar[str] = METRICS

    publisher: Publisher
    component: str
    instance_id: str
    region: str = "local"
    every_s: float = 0.0
    _last: float = field(default=0.0, init=False)

    def report(self, values: dict[str, float], step: int = -1, force: bool = True) -> bool:
        """Publish `values` (non-finite ones are dropped, not sent). With `force=False`, publish
        at most once every `every_s` seconds. Returns True if a record was sent."""
        now = time.time()
        if not force and now - self._last < self.every_s:
            return False
        clean = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}
        if not clean:
            return False
        metric = Metric(
            component=self.component,
            id=self.instance_id,
            region=self.region,
            step=step,
            time=now,
            values=clean,
        )
        self.publisher.send(self.TOPIC, metric, key=self.instance_id, lossy=True)
        self._last = now
        return True
