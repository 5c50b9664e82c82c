"""Snapshot and delta file formats: golden values of the sparse delta and bit-exact application."""

from __future__ import annotations

import math

import pytest
import torch

from astraflow.weights import format as fmt


def test_delta_holds_gap_coded_indices_and_raw_values() -> None:
    old = {
        "w": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.bfloat16),
        "b": torch.tensor([0.5, 0.25], dtype=torch.bfloat16),
    }
    new = {
        "w": torch.tensor([[1.0, 2.5, 3.0], [4.0, 5.0, -6.0]], dtype=torch.bfloat16),
        "b": old["b"].clone(),
    }
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
    unique = {
        "a": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "n": torch.tensor([7], dtype=torch.int64),
    }
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


@pytest.mark.parametrize(
    "bad",
    [
        {"x::idx": torch.tensor([9], dtype=torch.int16), "x::val": torch.tensor([1.0])},  # out of range
        {
            "x::idx": torch.tensor([1, 0], dtype=torch.int16),
            "x::val": torch.tensor([1.0, 2.0]),
        },  # repeats index 1
        {"x::idx": torch.tensor([1], dtype=torch.int16), "x::val": torch.tensor([1.0], dtype=torch.float16)},
        {"y::idx": torch.tensor([1], dtype=torch.int16), "y::val": torch.tensor([1.0])},  # unknown tensor
        {"x::idx": torch.tensor([1], dtype=torch.int16)},  # no values
    ],
)
def test_a_delta_that_does_not_fit_is_rejected(bad: dict[str, torch.Tensor]) -> None:
    with pytest.raises(fmt.FormatError):
        fmt.apply_delta({"x": torch.zeros(4)}, bad)


def test_garbage_is_a_format_error() -> None:
    for data in (b"", b"\x00" * 7, b"\xff" * 64, fmt.ZSTD_MAGIC + b"\x00" * 20):
        with pytest.raises(fmt.FormatError):
            fmt.decode_file(data)


def _reference_delta(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The delta format, tensor by tensor, as the docstring of astraflow/weights/format.py states it."""
    out = {}
    for name in sorted(new):
        a, b = fmt.int_view(old[name]).reshape(-1), fmt.int_view(new[name]).reshape(-1)
        idx = (a != b).nonzero().reshape(-1)
        if idx.numel() * (b.element_size() + 2) >= b.numel() * b.element_size():  # cheaper in full
            out[name + fmt.FULL] = new[name].reshape(-1)
        elif idx.numel():
            gaps = torch.diff(idx, prepend=idx.new_zeros(1))
            top = int(gaps.max())
            dt = torch.int16 if top <= 32767 else torch.int32 if top <= 2**31 - 1 else torch.int64
            out[name + fmt.IDX] = gaps.to(dt)
            out[name + fmt.VAL] = new[name].reshape(-1)[idx]
    return out


@pytest.mark.parametrize("seed", range(5))
def test_the_diff_of_many_tensors_is_the_reference_per_tensor_delta(seed: int) -> None:
    """diff_states' delta is exactly the reference one, tensor by tensor: tensors unchanged, changed
    in their first or last element only, or entirely, of mixed dtypes, with gaps that need int32."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {
        "a.bf16": ((64, 33), torch.bfloat16),
        "b.bf16": ((7,), torch.bfloat16),
        "c.f32": ((40_000,), torch.float32),
        "d.f32": ((3, 3), torch.float32),
        "e.i64": ((5,), torch.int64),
        "f.f16": ((17, 2), torch.float16),
        "g.bf16": ((1,), torch.bfloat16),
    }
    old = {n: (torch.randn(s, generator=gen) * 10).to(dt) for n, (s, dt) in shapes.items()}
    new = {n: t.clone() for n, t in old.items()}
    for t in new.values():
        flat = t.reshape(-1)
        kind = int(torch.randint(0, 5, (1,), generator=gen))
        if kind == 1:
            flat[0] += 1
        elif kind == 2:
            flat[-1] += 1
        elif kind >= 3:  # 30% of it (element by element), or 70% (in full)
            mask = torch.rand(flat.shape, generator=gen) < (0.3 if kind == 3 else 0.7)
            flat[mask] = flat[mask] + 1
    new["c.f32"][39_999] = 123.0  # a gap past int16 (unless the random ones came close)
    tensors, changed, total = fmt.diff_states(old, new)
    want = _reference_delta(old, new)
    assert set(tensors) == set(want)
    for k in want:
        assert tensors[k].dtype == want[k].dtype and torch.equal(
            fmt.int_view(tensors[k]), fmt.int_view(want[k])
        ), k
    assert total == sum(t.numel() for t in new.values())
    assert changed == sum(int((fmt.int_view(old[k]) != fmt.int_view(new[k])).sum()) for k in new)
    state = {k: v.clone() for k, v in old.items()}
    fmt.apply_delta(state, tensors)
    assert all(torch.equal(fmt.int_view(state[k]), fmt.int_view(new[k])) for k in new)


def test_a_delta_with_non_integer_indices_is_refused() -> None:
    state = {"x": torch.zeros(4)}
    bad = {"x::idx": torch.tensor([1.0, 1.0]), "x::val": torch.tensor([1.0, 2.0])}
    with pytest.raises(fmt.FormatError, match="indices of dtype torch.float32"):
        fmt.apply_delta(state, bad)
    assert torch.equal(state["x"], torch.zeros(4))


def test_a_tensor_changed_in_most_elements_travels_in_full_and_the_delta_stays_below_the_snapshot() -> None:
    """Gaps and values of 60% of a bfloat16 tensor's elements would take 1.2x its bytes: the delta holds
    the tensor in full instead, and a delta of every element of every tensor stays the snapshot's size."""
    gen = torch.Generator().manual_seed(0)
    old = {
        "w": torch.randn(256, 64, generator=gen).to(torch.bfloat16),
        "b": torch.randn(64, generator=gen).to(torch.bfloat16),
    }
    new = {k: v.clone() for k, v in old.items()}
    new["w"].reshape(-1)[torch.rand(256 * 64, generator=gen) < 0.6] += 1
    new["b"][3] += 1  # one element: by index
    tensors, changed, _ = fmt.diff_states(old, new)
    assert set(tensors) == {"w::full", "b::idx", "b::val"}
    assert changed == int((fmt.int_view(old["w"]) != fmt.int_view(new["w"])).sum()) + 1
    state = {k: v.clone() for k, v in old.items()}
    fmt.apply_delta(state, tensors)
    assert all(torch.equal(fmt.int_view(state[k]), fmt.int_view(new[k])) for k in new)

    every = {k: (v.float() + 1).to(torch.bfloat16) for k, v in old.items()}
    delta = fmt.encode_delta(fmt.diff_states(old, every)[0], {}, "p", 1, 0, "", "", "d", 0, 0)
    snapshot = fmt.encode_snapshot(every, {}, "p", 1, "d")
    assert len(delta) <= len(snapshot) + 256  # headers differ; the tensors' bytes are the same


@pytest.mark.parametrize(
    "bad",
    [
        {"x::full": torch.zeros(3)},  # the wrong size
        {"x::full": torch.zeros(4, dtype=torch.float16)},  # the wrong dtype
        {"y::full": torch.zeros(4)},  # unknown tensor
        {
            "x::full": torch.zeros(4),
            "x::idx": torch.tensor([1], dtype=torch.int16),
            "x::val": torch.tensor([1.0]),
        },
    ],
)
def test_a_full_tensor_that_does_not_fit_is_rejected(bad: dict[str, torch.Tensor]) -> None:
    state = {"x": torch.ones(4)}
    with pytest.raises(fmt.FormatError):
        fmt.apply_delta(state, bad)
    assert torch.equal(state["x"], torch.ones(4))
