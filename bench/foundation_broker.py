"""Local broker start time: cold (fresh data directory: format + JVM start until an AdminClient
answers) and warm (restart on an existing directory), plus the graceful stop, over N rounds.
The JVM's own start-up (`java -version`) is measured alongside as the floor.

    python bench/foundation_broker.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from astraflow import broker
from bench.machine import describe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    broker.ensure_jars()
    java = broker.find_java()
    t = time.perf_counter()
    subprocess.run([java, "-version"], capture_output=True, check=True)
    jvm = time.perf_counter() - t
    cold, warm, stops = [], [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp)
            t = time.perf_counter()
            broker.start(port=0, data_dir=data)
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            broker.stop(data)
            stops.append(time.perf_counter() - t)
            t = time.perf_counter()
            broker.start(port=0, data_dir=data)
            warm.append(time.perf_counter() - t)
            broker.stop(data)
    print(f"machine: {describe()}")
    print(f"Kafka {broker.kafka_version()}, {args.rounds} rounds")
    print(
        f"cold start (format + start + AdminClient answers): median {statistics.median(cold):.2f}s "
        f"(min {min(cold):.2f}, max {max(cold):.2f})"
    )
    print(f"warm restart (existing data dir):                  median {statistics.median(warm):.2f}s")
    print(f"graceful stop:                                     median {statistics.median(stops):.2f}s")
    print(
        f"bare JVM start (java -version):                    {jvm:.2f}s "
        f"(cold start = {statistics.median(cold) / jvm:.0f}x the JVM floor)"
    )


if __name__ == "__main__":
    main()
