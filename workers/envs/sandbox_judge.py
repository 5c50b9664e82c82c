"""Judges a sandbox child's output in the trusted process: the untrusted code never judges itself.

The child (`sandbox_harness.py`) gets only the test inputs. For each test it writes one JSON line to
its result pipe: `{"r": value}` (the function's result, only if it is a plain JSON value of an exact
built-in type), `{"x": "typename"}` (a result that cannot be judged: a tuple, a set, an `int` or `str`
subclass...), or, once, `{"e": "reason"}` (the run stopped: an exception, a blocked action) as its
last line. Here those bytes are parsed with `json` (so every value is a fresh `dict`, `list`, `str`,
`int`, `float`, `bool` or `None`: no object the untrusted code made, no `__eq__` it wrote) and
compared with the expected values with exact type checks (`True` is not `1`, `2.0` is not `2`).
Anything else (a line that is not one of those records, more records than tests, a record after
`e`, output past the size limit) scores 0 with the reason. `passed` never exceeds `total`. The
first line, `{"n": "netns"}`, is written by the harness before the untrusted code runs and only
says how the child left the network.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

REASON_CHARS = 300


@dataclass(frozen=True)
class Verdict:
    passed: int
    complete: bool
    """True when the child reported a result for every test (or stopped with an `e` record)."""
    reason: str | None = None
    network: str | None = None
    """How the child left the network, from the line it wrote before the untrusted code ran."""


def plain(value: Any) -> Any:
    """`value` as the child's results will look after the JSON round trip (tuples become lists)."""
    return json.loads(json.dumps(value))


def same(got: Any, want: Any) -> bool:
    """Exact equality of two plain JSON values: same built-in types all the way down."""
    if type(got) is not type(want):
        return False
    if type(want) is list:
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want, strict=True))
    if type(want) is dict:
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return bool(got == want)  # both are the same exact built-in scalar type, made by json here


def _short(value: Any) -> str:
    return json.dumps(value)[:80]


def judge(out: bytes, expected: list[Any], limit: int) -> Verdict:
    """Score the child's result lines `out` against `expected` (plain JSON values)."""
    total = len(expected)
    if len(out) > limit:
        return Verdict(0, False, f"malformed output: more than {limit} bytes")
    lines = out.split(b"\n")
    if lines.pop():  # the text after the last newline: empty unless a line was cut off
        return Verdict(0, False, "malformed output: an unterminated line")
    network = None
    if lines and lines[0].startswith(b'{"n": '):
        with contextlib.suppress(ValueError):
            network = str(json.loads(lines.pop(0))["n"])[:40]
    passed, reason, stopped, seen = 0, None, False, 0
    for n, line in enumerate(lines, start=1 if network else 0):
        if stopped:
            return Verdict(0, False, "malformed output: a line after the final error record")
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            return Verdict(0, False, f"malformed output line {n}: {type(exc).__name__}")
        if type(record) is not dict or len(record) != 1:
            return Verdict(0, False, f"malformed output line {n}: not a one-key object")
        ((key, value),) = record.items()
        if key == "e" and type(value) is str:
            stopped = True
            reason = value[:REASON_CHARS]  # why it stopped says more than an earlier wrong answer
            continue
        if key not in ("r", "x") or (key == "x" and type(value) is not str):
            return Verdict(0, False, f"malformed output line {n}: unknown record {key[:20]!r}")
        if seen >= total:
            return Verdict(0, False, f"malformed output: more than {total} results")
        if key == "r" and same(value, expected[seen]):
            passed += 1
        elif reason is None:
            got = f"a value of type {value[:40]}, not a plain JSON value" if key == "x" else _short(value)
            reason = f"test {seen}: got {got}, expected {_short(expected[seen])}"
        seen += 1
    complete = stopped or seen == total
    return Verdict(min(passed, total), complete, reason, network)
