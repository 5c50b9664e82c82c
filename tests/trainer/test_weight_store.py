"""The weight store: delta chains rebuild published weights bit for bit, integrity errors name the
file, pruning keeps what workers need, a reopened store continues its chain."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from astraflow.errors import AstraFlowError
from astraflow.records import WeightVersion, decode, encode
from astraflow.weights import (
    HeldWeights,
    WeightIntegrityError,
    WeightNotFoundError,
    WeightStore,
    fetch_weights,
    transport,
)
from tests.trainer.helpers import assert_bit_identical, nudge, published, tiny_model

#: the store, the event of each version 0..10 and the published weights of each
History = tuple[WeightStore, list[WeightVersion], list[dict[str, torch.Tensor]]]


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    """A store with versions 0..10 (snapshots at 0, 4, 8) and the bf16 weights of each version."""
    root = tmp_path_factory.mktemp("store")
    model = tiny_model()
    gen = torch.Generator().manual_seed(1)
    store = WeightStore(root, "solver", snapshot_every=4, keep_versions=100)
    events: list[WeightVersion] = []
    weights: list[dict[str, torch.Tensor]] = []
    for v in range(11):
        if v:
            nudge(model, gen)
        events.append(store.publish(model.state_dict(), v, step=3 * v))
        weights.append(published(model))
    return store, events, weights


def test_events_describe_snapshots_and_deltas(history: History) -> None:
    store, events, _ = history
    assert [e.snapshot_version for e in events] == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8]
    assert events[0].delta_uri is None and events[0].changed_fraction is None
    for v, e in enumerate(events[1:], start=1):
        assert e.delta_base == v - 1 and e.step == 3 * v and e.dtype == "bfloat16"
        assert e.changed_fraction is not None and 0 < e.changed_fraction <= 1
        assert e.delta_bytes is not None and e.delta_bytes < e.snapshot_bytes
        assert decode(encode(e), WeightVersion) == e  # a valid wire record
    assert store.event(7) == events[7]


def test_ten_deltas_on_a_snapshot_rebuild_the_published_weights_bit_for_bit(history: History) -> None:
    _, events, weights = history
    held = fetch_weights(events[0], None)
    assert_bit_identical(held.state, weights[0])
    rebuilt = fetch_weights(events[10], held)  # one call walks the chain 10 -> 0
    assert rebuilt.version == 10
    assert_bit_identical(rebuilt.state, weights[10])
    assert_bit_identical(held.state, weights[0])  # the held weights are left untouched
    for v in range(1, 11):  # and version by version, as a worker following every event would
        held = fetch_weights(events[v], held)
        assert_bit_identical(held.state, weights[v])


def test_without_held_weights_the_snapshot_and_following_deltas_are_loaded(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, events, weights = history
    read = _record_reads(monkeypatch)
    held = fetch_weights(events[10], None)
    assert_bit_identical(held.state, weights[10])
    assert [Path(u).name.split(".")[1] for u in read] == ["snapshot", "delta", "delta"]
    assert read[0] == events[8].snapshot_uri


def test_held_weights_catch_up_by_deltas_only(history: History, monkeypatch: pytest.MonkeyPatch) -> None:
    _, events, weights = history
    held = fetch_weights(events[6], None)
    read = _record_reads(monkeypatch)
    assert_bit_identical(fetch_weights(events[10], held).state, weights[10])
    assert len(read) == 4 and all(".delta." in u for u in read)  # deltas 10, 9, 8, 7 and no snapshot


def test_tied_weights_come_back_tied_and_load_into_the_model(history: History) -> None:
    _, events, weights = history
    held = fetch_weights(events[5], None)
    assert held.state["lm_head.weight"] is held.state["model.embed_tokens.weight"]
    model = tiny_model().to(torch.bfloat16)
    model.load_state_dict(held.state)  # strict: every name is there
    assert_bit_identical(published(model), weights[5])


def test_modified_held_weights_fall_back_to_the_snapshot(history: History) -> None:
    _, events, weights = history
    held = fetch_weights(events[3], None)
    as_float = HeldWeights(3, {k: v.float() for k, v in held.state.items()})
    assert_bit_identical(fetch_weights(events[6], as_float).state, weights[6])
    tampered = HeldWeights(3, {k: v.clone() for k, v in held.state.items()})
    tampered.state["model.norm.weight"].view(torch.int16)[0] ^= 1
    assert_bit_identical(fetch_weights(events[6], tampered).state, weights[6])


def test_corrupt_files_raise_integrity_errors_that_name_them(tmp_path: Path) -> None:
    model, gen = tiny_model(), torch.Generator().manual_seed(2)
    store = WeightStore(tmp_path, "p", snapshot_every=100)
    events = [store.publish(model.state_dict(), 0)]
    for v in (1, 2, 3):
        nudge(model, gen)
        events.append(store.publish(model.state_dict(), v))
    held = fetch_weights(events[0], None)
    middle = transport.local_path(events[2].delta_uri)
    _flip_byte(middle, -5)
    with pytest.raises(WeightIntegrityError) as err:
        fetch_weights(events[3], held)  # the chain 3 -> 2 -> 1: link 2 fails the sha256 that 3 names
    assert err.value.uri == events[2].delta_uri and middle.name in str(err.value)
    assert isinstance(err.value, AstraFlowError)
    snap = transport.local_path(events[0].snapshot_uri)
    _flip_byte(snap, 100)
    with pytest.raises(WeightIntegrityError, match=snap.name):
        fetch_weights(events[1], None)


def test_an_event_whose_files_are_gone_is_a_clear_error(tmp_path: Path) -> None:
    store = WeightStore(tmp_path, "p")
    event = store.publish(tiny_model().state_dict(), 0)
    transport.local_path(event.snapshot_uri).unlink()
    with pytest.raises(WeightNotFoundError, match="no such file"):
        fetch_weights(event, None)


def test_pruning_keeps_what_workers_may_need(tmp_path: Path) -> None:
    model, gen = tiny_model(), torch.Generator().manual_seed(3)
    store = WeightStore(tmp_path, "p", snapshot_every=4, keep_versions=3)
    events, weights = [], []
    for v in range(15):
        if v:
            nudge(model, gen)
        events.append(store.publish(model.state_dict(), v))
        weights.append(published(model))
    # the last 3 events (12, 13, 14) plus a spare (11) need snapshot 8 and every delta after it
    assert store.versions == list(range(8, 15))
    files = {p.name for p in store.objects.iterdir()}
    assert len(files) == 2 + 7  # snapshots 8 and 12, deltas 8..14
    for v in (11, 12, 13, 14):
        assert_bit_identical(fetch_weights(events[v], None).state, weights[v])
    held = HeldWeights(5, weights[5])  # older than anything kept: the chain is broken, so the snapshot
    assert_bit_identical(fetch_weights(events[14], held).state, weights[14])
    with pytest.raises(WeightNotFoundError):
        fetch_weights(events[6], None)  # an event long superseded: its snapshot is gone


def test_a_reopened_store_continues_the_chain_after_a_lost_version(tmp_path: Path) -> None:
    model, gen = tiny_model(), torch.Generator().manual_seed(4)
    first = WeightStore(tmp_path, "p", snapshot_every=10)
    for v in range(3):
        if v:
            nudge(model, gen)
        event2 = first.publish(model.state_dict(), v)
    held2 = fetch_weights(event2, None)
    lost = tiny_model()  # version 3: weights the resumed trainer does not descend from
    first.publish(lost.state_dict(), 3)
    again = WeightStore(tmp_path, "p", snapshot_every=10)
    assert again.latest == 3
    nudge(model, gen)
    event4 = again.publish(model.state_dict(), 4)  # chained on the lost version 3
    # a worker at version 2 catches up by the deltas through the lost version
    assert_bit_identical(fetch_weights(event4, held2).state, published(model))
    with pytest.raises(AstraFlowError, match="not after"):
        again.publish(model.state_dict(), 4)
    with pytest.raises(AstraFlowError, match="does not follow"):
        again.publish(model.state_dict(), 6)
    assert again.publish(model.state_dict(), 6, snapshot=True).delta_uri is None


def test_float32_and_uncompressed_stores_work_too(tmp_path: Path) -> None:
    model, gen = tiny_model(), torch.Generator().manual_seed(5)
    store = WeightStore(tmp_path, "p", dtype="float32", compress_level=0)
    store.publish(model.state_dict(), 0)
    nudge(model, gen)
    event = store.publish(model.state_dict(), 1)
    assert event.dtype == "float32" and event.delta_uri.endswith(".delta.safetensors")
    assert_bit_identical(fetch_weights(event, None).state, published(model, torch.float32))


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _record_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from astraflow.weights import fetch

    seen: list[str] = []
    real = fetch.read_verified

    def spy(uri: str, sha: str, cache_dir: Path | None = None, **bounds: int | None) -> bytes:
        seen.append(uri)
        return real(uri, sha, cache_dir, **bounds)

    monkeypatch.setattr(fetch, "read_verified", spy)
    return seen


def test_the_files_writer_is_safetensors_for_every_dtype_and_shape() -> None:
    """`format.save` replaces safetensors' own writer (4x faster): safetensors reads its files back
    bit for bit, NaN payloads, odd lengths, empty and 0-d tensors included, each tensor aligned."""
    import json
    import struct

    from safetensors.torch import load

    from astraflow.weights import format as fmt

    gen = torch.Generator().manual_seed(3)
    tensors = {
        "bf16::val": torch.randn(7, generator=gen).to(torch.bfloat16),
        "f32": torch.tensor([float("nan"), -0.0, float("inf"), 1.5]),
        "f16": torch.randn(3, 5, generator=gen).to(torch.float16),
        "i16::idx": torch.tensor([0, 1, 3], dtype=torch.int16),  # 6 bytes: what follows must stay aligned
        "i32": torch.tensor([1 << 20, -7], dtype=torch.int32),
        "i64": torch.tensor([1 << 40], dtype=torch.int64),
        "u8": torch.tensor([255, 0, 1], dtype=torch.uint8),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.5),
        "strided": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # not contiguous
    }
    data = fmt.save(tensors, {"format": fmt.DELTA_FORMAT, "x": "y"})
    back = load(data)
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert torch.equal(fmt.int_view(back[name].contiguous()), fmt.int_view(t.contiguous())), name
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + n])
    assert n % 8 == 0 and header["__metadata__"] == {"format": fmt.DELTA_FORMAT, "x": "y"}
    for name, t in tensors.items():
        assert header[name]["data_offsets"][0] % t.element_size() == 0, name
    assert fmt.read_metadata(data)["x"] == "y"


def test_safetensors_file_reader_opens_the_files_writer_output(tmp_path: Path) -> None:
    from safetensors import safe_open

    from astraflow.weights import format as fmt

    path = tmp_path / "delta.safetensors"
    path.write_bytes(fmt.save({"w": torch.arange(5, dtype=torch.bfloat16)}, {"format": fmt.SNAPSHOT_FORMAT}))
    with safe_open(str(path), framework="pt") as fh:  # the reader other tools use
        assert fh.metadata() == {"format": fmt.SNAPSHOT_FORMAT}
        assert torch.equal(fh.get_tensor("w"), torch.arange(5, dtype=torch.bfloat16))


def test_deltas_are_compressed_only_where_they_may_cross_a_network() -> None:
    from astraflow.config.trainer import TrainerConfig

    assert TrainerConfig().delta_compress_level() == 0  # the run directory's store, read from the page cache
    assert TrainerConfig(serve_http=True).delta_compress_level() == 1
    assert TrainerConfig(store_dir="/shared/weights").delta_compress_level() == 1
    assert TrainerConfig(compress_level=3).delta_compress_level() == 3
    assert TrainerConfig(serve_http=True, compress_level=0).delta_compress_level() == 0
