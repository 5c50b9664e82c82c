"""Samples that retention deleted before a resumed trainer could read them.

A trainer resumes at the offsets of its checkpoint. If the broker's retention deleted records
past such an offset in the meantime, the position is out of range and librdkafka resets it to the
earliest offset without a word: those samples were never trained and nobody would know. At setup
the leader compares each partition's low watermark with the checkpoint's offset; the gap is logged
at warning level (partitions and offsets) and counted in `samples.lost_to_retention`.
"""

from __future__ import annotations


def gaps(saved: dict[int, int], lows: dict[int, int]) -> dict[int, tuple[int, int]]:
    """{partition: (checkpoint offset, low watermark)} where the low watermark is past the offset.
    A partition without a saved offset starts at the beginning and loses nothing."""
    return {p: (off, lows[p]) for p, off in sorted(saved.items()) if p in lows and lows[p] > off}


def describe(topic: str, found: dict[int, tuple[int, int]]) -> str:
    lost = sum(low - off for off, low in found.values())
    where = ", ".join(f"partition {p}: offsets {off}..{low - 1}" for p, (off, low) in found.items())
    return (
        f"{topic}: {lost} samples past the checkpoint were deleted by retention before this trainer "
        f"read them ({where}); it resumes at the earliest offsets left"
    )
