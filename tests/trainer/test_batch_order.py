"""`trainer.order`: FIFO and earliest-deadline-first batches from hand-built samples, and that
reordering loses nothing, drops nothing it would not drop anyway, and never moves the restart
offset past a sample that has not been trained."""

from __future__ import annotations

import random

import pytest

from astraflow.config import Recipe
from astraflow.config.base import validate_model
from astraflow.errors import ConfigError
from tests.trainer.test_batching import sample
from trainer.batching import GroupBuffer, Order


def add_group(buf: GroupBuffer, task: str, versions: list[int], partition: int, first_offset: int) -> None:
    """One group of len(versions) samples; sample i generated at versions[i]."""
    for i, v in enumerate(versions):
        buf.add(sample(task, i, n=len(versions), versions=(v, v)), partition, first_offset + i)


def test_edf_takes_the_group_closest_to_its_deadline_first() -> None:
    fifo, edf = GroupBuffer("p"), GroupBuffer("p", order="edf")
    for buf in (fifo, edf):
        add_group(buf, "new", [5, 5], 0, 0)  # deadline 7
        add_group(buf, "old", [3, 4], 0, 2)  # deadline 5
        add_group(buf, "tie", [3, 6], 0, 4)  # deadline 5, completed after "old"
    assert [fifo.take(1, None, 5, 2).group_ids[0] for _ in range(3)] == ["new#0", "old#0", "tie#0"]
    assert [edf.take(1, None, 5, 2).group_ids[0] for _ in range(3)] == ["old#0", "tie#0", "new#0"]


def test_edf_ranks_a_group_by_the_samples_it_can_still_train() -> None:
    buf = GroupBuffer("p", order="edf")
    add_group(buf, "mixed", [1, 6], 0, 0)  # sample 0 already stale at 6 (deadline 3); sample 1: 8
    add_group(buf, "live", [4, 4], 0, 2)  # deadline 6: trains first
    batch = buf.take(1, None, version=6, max_staleness=2)
    assert batch.group_ids == ["live#0"] and batch.lags == [2, 2] and not batch.stale
    batch = buf.take(1, None, version=6, max_staleness=2)
    assert batch.group_ids == ["mixed#0"] and batch.lags == [0] and len(batch.stale) == 1


def test_edf_drops_wholly_stale_groups_without_taking_a_place() -> None:
    buf = GroupBuffer("p", order="edf")
    add_group(buf, "dead", [1, 2], 0, 0)
    add_group(buf, "a", [5, 5], 0, 2)
    add_group(buf, "b", [6, 6], 0, 4)
    batch = buf.take(2, None, version=6, max_staleness=2)
    assert batch.group_ids == ["dead#0", "a#0", "b#0"]  # two places, both for trainable groups
    assert len(batch.samples) == 4 and len(batch.stale) == 2 and buf.counts["samples.stale"] == 2
    assert buf.take(1, None, 6, 2) is None


def test_edf_drops_wholly_stale_groups_at_once_even_without_a_batch() -> None:
    """Kept until a batch closed, such groups held places in the feeder's admission window, which
    then admitted nothing, so no batch closed: the fault tests' stall (the trainer polled for ever
    with complete groups queued). A batch of only them (no samples) consumes them now."""
    buf = GroupBuffer("p", order="edf")
    add_group(buf, "dead", [1, 1], 0, 0)
    add_group(buf, "live", [6, 6], 0, 2)
    batch = buf.take(2, None, version=6, max_staleness=2)  # one trainable group: no batch of 2
    assert batch.group_ids == ["dead#0"] and batch.samples == [] and len(batch.stale) == 2
    assert list(buf.ready) == ["live#0"] and buf.counts["samples.stale"] == 2
    buf.done(batch, step=0)
    assert buf.take(2, None, 6, 2) is None  # the trainable one waits for a second
    add_group(buf, "b", [6, 6], 0, 4)
    assert buf.take(2, None, 6, 2).group_ids == ["live#0", "b#0"]


def test_out_of_order_batches_never_release_an_untrained_offset() -> None:
    buf = GroupBuffer("p", order="edf")
    add_group(buf, "young", [5, 5], 0, 0)  # offsets 0, 1
    add_group(buf, "old", [3, 3], 0, 2)  # offsets 2, 3
    buf.done(buf.take(1, None, 5, 2), step=1)
    assert buf.trained.keys() == {"old#0"}
    assert buf.offsets() == {0: 0}  # "young" at offsets 0-1 is not trained: resume there
    buf.done(buf.take(1, None, 5, 2), step=2)
    assert buf.offsets() == {0: 4}


@pytest.mark.parametrize("order", ["fifo", "edf"])
def test_reordering_loses_nothing(order: Order) -> None:
    """Random arrival over two partitions and random versions: every sample that came in is trained
    or counted stale exactly once, and the restart offset of each partition never passes the lowest
    offset of a group not yet done."""
    rng = random.Random(7)
    buf = GroupBuffer("p", order=order)
    next_offset = {0: 0, 1: 0}
    where: dict[str, list[tuple[int, int]]] = {}
    version = trained = stale = 0
    for step in range(1, 200):
        for _ in range(rng.randrange(0, 4)):
            task, partition = f"t{len(where)}", rng.randrange(2)
            versions = [max(0, version - rng.randrange(4)) for _ in range(3)]
            add_group(buf, task, versions, partition, next_offset[partition])
            where[f"{task}#0"] = [(partition, next_offset[partition] + i) for i in range(3)]
            next_offset[partition] += 3
        batch = buf.take(2, None, version, max_staleness=2)
        if batch is None:
            continue
        buf.done(batch, step)
        trained += len(batch.samples)
        stale += len(batch.stale)
        version += rng.randrange(2)
        waiting = [o for gid, offs in where.items() if gid not in buf.trained for o in offs]
        for partition, offset in buf.offsets().items():
            assert offset <= min((o for p, o in waiting if p == partition), default=next_offset[partition])
    assert trained + stale == buf.counts["samples.in"] - 3 * len(buf.ready)
    assert stale == buf.counts["samples.stale"] and stale > 0
    assert len(buf.trained) == buf.counts["groups.trained"] == len(where) - len(buf.ready)


def test_the_recipe_names_the_order_and_refuses_unknown_ones() -> None:
    recipe = validate_model(Recipe, {"name": "r", "trainer": {"order": "edf"}}, "r.yaml")
    assert recipe.trainer.order == "edf"
    assert validate_model(Recipe, {"name": "r"}, "r.yaml").trainer.order == "fifo"
    with pytest.raises(ConfigError, match=r"r\.yaml: trainer\.order: .*'fifo' or 'edf'"):
        validate_model(Recipe, {"name": "r", "trainer": {"order": "lifo"}}, "r.yaml")
    with pytest.raises(ValueError, match="unknown batch order 'lifo'; known: fifo, edf"):
        GroupBuffer("p", order="lifo")  # type: ignore[arg-type]
