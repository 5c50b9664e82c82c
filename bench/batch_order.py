"""FIFO vs earliest-deadline-first batches (`trainer.order`, trainer/batching.py) on one recipe and
the same seeds: stale drops, the lag distribution of trained samples and reward (bench/variants.py).
Reordering matters only where groups complete out of version order, so the default recipe has
max_staleness 2 and two workers (multi-turn episodes of different lengths).

    python -m bench.batch_order [RECIPE] [--values fifo,edf] [--seeds 2] [--steps 80] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

from bench.variants import cli

if __name__ == "__main__":
    cli(recipe="guess_number", key="trainer.order", values="fifo,edf", name="batch_order")
