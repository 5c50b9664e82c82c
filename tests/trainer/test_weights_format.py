"""Snapshot and delta file formats: golden values of the sparse delta and bit-exact application."""

from __future__ import annotations

import math

import pytest
import torch

from astraflow.weights import format as fmt


def test_delta_holds_gap_coded_indices_and_raw_values() -> None:
    old = {"w": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.bfloat16),
           "b": torch.tensor([0.5, 0.25], dtype=torch.bfloat16)}
    new = {"w": torch.tensor([[1.0, 2.5, 3.0], [4.0, 5.0, -6.0]], dtype=torch.bfloat16),
           "b": old["b"].clone()}
    tensors, changed, total = fmt.diff_states(old, new)
    assert (changed, total) == (2, 8)
    assert set(tensors) == {"w::idx", "w::val"}  # unchanged tensors are not in the delta
    assert tensors["w::idx"].dtype == torch.int16
    assert tensors["w::idx"].tolist() == [1, 4]  # flat indices 1 and 5, gap-coded
    assert tensors["w::val"].tolist() == [2.5, -6.0]
    state = {k: v.clone() for k, v in old.items()}
    fmt.apply_delta(state, tensors)
    assert torch.equal(state["w"], new["w"]) and torch.equal(state["b"], new["b"])


def test_raw_bits_not_float_equality_decide_what_changed() -> None:
    old = {"x": torch.tensor([0.0, float("nan"), 1.0, 2.0])}
    new = {"x": torch.tensor([-0.0, float("nan"), 1.0, 2.0])}
    tensors, changed, _ = fmt.diff_states(old, new)
    assert changed == 1  # -0.0 == 0.0 as floats, but not as bits; NaN == NaN as bits
    state = {"x": old["x"].clone()}
    fmt.apply_delta(state, tensors)
    assert math.copysign(1.0, state["x"][0].item()) == -1.0


def test_wide_gaps_widen_the_index_dtype() -> None:
    old = {"x": torch.zeros(100_000)}
    new = {"x": old["x"].clone()}
    new["x"][[3, 70_000]] = 1.0
    tensors, _, _ = fmt.diff_states(old, new)
    assert tensors["x::idx"].dtype == torch.int32 and tensors["x::idx"].tolist() == [3, 69_997]


def test_file_round_trip_with_and_without_zstd() -> None:
    unique = {"a": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "n": torch.tensor([7], dtype=torch.int64)}
    digest = fmt.state_digest(unique)
    snap = fmt.encode_snapshot(unique, {"tied": "a"}, "solver", 3, digest)
    tensors, meta = fmt.decode_file(snap)
    assert meta["format"] == fmt.SNAPSHOT_FORMAT and meta["version"] == 3 and meta["aliases"] == {"tied": "a"}
    assert fmt.state_digest(tensors) == digest
    for level in (0, 3):
        data = fmt.compress(snap, level)
        assert data.startswith(fmt.ZSTD_MAGIC) == (level > 0)
        assert fmt.state_digest(fmt.decode_file(data)[0]) == digest


def test_state_digest_sees_every_bit_and_every_name() -> None:
    a = {"x": torch.tensor([1.0, 2.0], dtype=torch.bfloat16)}
    b = {"x": a["x"].clone()}
    assert fmt.state_digest(a) == fmt.state_digest(b)
    b["x"].view(torch.int16)[1] ^= 1  # flip the lowest mantissa bit
    assert fmt.state_digest(a) != fmt.state_digest(b)
    assert fmt.state_digest(a) != fmt.state_digest({"y": a["x"]})


def test_aliases_of_tied_weights_are_found_and_restored() -> None:
    emb = torch.randn(4, 3)
    state = {"model.embed": emb, "lm_head": emb, "other": torch.randn(4, 3)}
    unique, aliases = fmt.split_aliases(state)
    assert aliases == {"model.embed": "lm_head"} and set(unique) == {"lm_head", "other"}
    full = fmt.with_aliases(unique, aliases)
    assert full["model.embed"] is full["lm_head"]


@pytest.mark.parametrize("bad", [
    {"x::idx": torch.tensor([9], dtype=torch.int16), "x::val": torch.tensor([1.0])},  # out of range
    {"x::idx": torch.tensor([1, 0], dtype=torch.int16), "x::val": torch.tensor([1.0, 2.0])},  # repeats index 1
    {"x::idx": torch.tensor([1], dtype=torch.int16), "x::val": torch.tensor([1.0], dtype=torch.float16)},
    {"y::idx": torch.tensor([1], dtype=torch.int16), "y::val": torch.tensor([1.0])},  # unknown tensor
    {"x::idx": torch.tensor([1], dtype=torch.int16)},  # no values
])
def test_a_delta_that_does_not_fit_is_rejected(bad: dict[str, torch.Tensor]) -> None:
    with pytest.raises(fmt.FormatError):
        fmt.apply_delta({"x": torch.zeros(4)}, bad)


def test_garbage_is_a_format_error() -> None:
    for data in (b"", b"\x00" * 7, b"\xff" * 64, fmt.ZSTD_MAGIC + b"\x00" * 20):
        with pytest.raises(fmt.FormatError):
            fmt.decode_file(data)
