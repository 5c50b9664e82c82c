"""The typed state keeps its stored form: group metas, task summaries and task states are written
as the same msgpack bytes as before they had types, and a worker reading entries an older worker
wrote (a changelog restore after an upgrade) carries on with them.

The golden bytes were produced by the untyped code (main at 8e82403) with the table codec of
streams/faust_glue.py, from the same calls as below."""

from __future__ import annotations

from typing import Any

from astraflow.config.streams import GroupConfig
from astraflow.records import encode
from streams.faust_glue import MsgpackCodec
from streams.grouping import DictTable, GroupCollector
from streams.stats import dropped_summary, fold, parse_summary, summarize, to_record
from streams.testing import make_group, make_traj

CODEC = MsgpackCodec()

# group t0#0 (size 3, partition 5): two trajectories at offsets 100 and 102; then the third at 103
# and the intent at 14.0 for ("samples.policy", 1), ("samples.policy", 0); then done at 15.0
PENDING = bytes.fromhex(
    "89a17005a57374617465a770656e64696e67a56669727374cb4024000000000000a473697a6503a369647392a674302330"
    "2330a6743023302331a46f666673926466a47461736ba27430a3656e76a56172697468a8706f6c696369657391a6706f6c"
    "696379"
)
INTENT = bytes.fromhex(
    "8ba17005a57374617465a6696e74656e74a56669727374cb4024000000000000a473697a6503a369647393a67430233023"
    "30a6743023302331a6743023302332a46f66667393646667a47461736ba27430a3656e76a56172697468a8706f6c696369"
    "657391a6706f6c696379a26174cb402c000000000000a7746172676574739292ae73616d706c65732e706f6c6963790192"
    "ae73616d706c65732e706f6c69637900"
)
DONE = bytes.fromhex("83a17005a57374617465a4646f6e65a26174cb402e000000000000")
# summarize(make_group([1.0, 0.0, 1.0, 0.5], task="t7")); dropped_summary("t7#1", "t7", "arith");
# both folded from nothing, then stamped {"at": 20.0, "p": 3} as the runtime does
SUMMARY = bytes.fromhex(
    "89a3676964a474372330a47461736ba27437a3656e76a56172697468a16e04aa7265776172645f73756dcb400400000000"
    "0000a973756363657373657302ad7a65726f5f76617269616e6365c2a776657273696f6e00a764726f70706564c2"
)
DROPPED = bytes.fromhex(
    "89a3676964a474372331a47461736ba27437a3656e76a56172697468a16e00aa7265776172645f73756dcb000000000000"
    "0000a973756363657373657300ad7a65726f5f76617269616e6365c2a776657273696f6effa764726f70706564c3"
)
STATE = bytes.fromhex(
    "8ba667726f75707302a773616d706c657304aa7265776172645f73756dcb4004000000000000a973756363657373657302"
    "ad7a65726f5f76617269616e636500a764726f7070656401a776657273696f6e00a6726563656e7492a474372330a47437"
    "2331a3656e76a56172697468a26174cb4034000000000000a17003"
)

TRAJS = [make_traj("t0", i, group_size=3) for i in range(3)]
TARGETS = [("samples.policy", 1), ("samples.policy", 0)]


def stored(table: DictTable, key: str) -> bytes:
    return CODEC.dumps(table.get(key))


def test_group_metas_are_written_as_before() -> None:
    c = GroupCollector(GroupConfig(), DictTable(), DictTable())
    c.add(TRAJS[0], encode(TRAJS[0]), 5, 10.0, 100)
    c.add(TRAJS[1], encode(TRAJS[1]), 5, 12.5, 102)
    assert stored(c.groups, "t0#0") == PENDING
    c.add(TRAJS[2], encode(TRAJS[2]), 5, 13.0, 103)
    c.mark_intent("t0#0", 14.0, TARGETS)
    assert stored(c.groups, "t0#0") == INTENT
    c.mark_done("t0#0", 15.0)
    assert stored(c.groups, "t0#0") == DONE


def restored(entries: dict[str, bytes]) -> GroupCollector:
    """A collector whose groups table was recovered from a changelog holding `entries`."""
    groups, bodies = DictTable(), DictTable()
    groups.data = {k: CODEC.loads(v) for k, v in entries.items()}
    for t in TRAJS[:2]:
        bodies.data[t.traj_id] = encode(t)
    return GroupCollector(GroupConfig(timeout_s=60.0), groups, bodies)


def test_a_pending_meta_written_before_carries_on() -> None:
    c = restored({"t0#0": PENDING})
    assert c.pending() == 1 and c.due(now=69.0) == [] and c.due(now=70.0) == [("t0#0", "timeout_emit")]
    assert c.add(TRAJS[1], encode(TRAJS[1]), 5, 13.0, 104).outcome == "duplicate"
    added = c.add(TRAJS[2], encode(TRAJS[2]), 5, 13.0, 103)
    assert (added.outcome, added.ready) == ("added", True)
    assert c.offsets(c.groups.get("t0#0")) == [100, 102, 103]
    assert [tid for tid, _ in c.bodies_of("t0#0")] == [t.traj_id for t in TRAJS]
    c.mark_intent("t0#0", 14.0, TARGETS)
    assert stored(c.groups, "t0#0") == INTENT  # the same bytes as if it had never been restored
    c.mark_done("t0#0", 15.0)
    assert stored(c.groups, "t0#0") == DONE


def test_intent_and_done_metas_written_before_carry_on() -> None:
    c = restored({"t0#0": INTENT, "t1#0": DONE})
    assert c.due(now=15.0) == [("t0#0", "complete")]  # the restart re-emits the interrupted group
    assert c.add(make_traj("t1", 0), b"", 5, 16.0).outcome == "late"
    assert c.due(now=15.0 + 3600.0) == [("t0#0", "complete"), ("t1#0", "expire")]
    assert c.pending() == 1


def test_task_summaries_and_states_are_written_as_before() -> None:
    s, d = summarize(make_group([1.0, 0.0, 1.0, 0.5], task="t7")), dropped_summary("t7#1", "t7", "arith")
    assert (CODEC.dumps(s), CODEC.dumps(d)) == (SUMMARY, DROPPED)
    state, _ = fold(None, s)
    state, _ = fold(state, d)
    assert CODEC.dumps({**state, "at": 20.0, "p": 3}) == STATE


def test_task_states_written_before_carry_on() -> None:
    old: Any = CODEC.loads(STATE)
    again, applied = fold(old, parse_summary(DROPPED, b"t7"))
    assert not applied and again == old  # its dedupe memory survived the restart
    more, applied = fold(old, parse_summary(SUMMARY.replace(b"t7#0", b"t7#2"), b"t7"))
    assert applied and more["groups"] == 3 and more["recent"] == ["t7#0", "t7#1", "t7#2"]
    rec = to_record("t7", more, now=21.0)
    assert (rec.samples, rec.mean_reward, rec.dropped_groups) == (8, 5.0 / 8, 1)
