"""File formats of the weight store: full snapshots and sparse deltas, both safetensors.

A *snapshot* is a safetensors file of a policy's unique tensors (tied weights stored once) in the
published dtype. A *delta* turns version `base` into `version` bit for bit: for each tensor whose
raw bits changed it holds

- `<name>::idx`: the sorted flat indices of the changed elements, gap-coded (first element
  absolute, then differences) in the narrowest of int16/int32/int64 that fits;
- `<name>::val`: the new values, same dtype as the tensor, copied as raw bits;

or, for a tensor of which so many elements changed that a value and a 2-byte gap each would take at
least the whole tensor's bytes (half of a bfloat16 tensor, two thirds of a float32 one), only

- `<name>::full`: every element's new value, flat, as raw bits.

So an uncompressed delta is never larger than a snapshot (with gaps and values alone, a delta of the
arithmetic recipe's model at lr 1e-3 was twice the snapshot), and applying it copies such tensors
instead of scattering their elements. Compressed, gaps shrink to a fraction of a byte and values of
unchanged elements cost more than they do: there a tensor goes in full from `COMPRESSED_FULL_FROM`
of it changed (measured on the recipe's deltas at lr 1e-4, 51% changed: zstd-1 903 KB with the byte
rule, 744 KB from 70%, 722 KB from 80%, 723 KB never). A reader from before `::full` refuses such a
delta, and a worker then loads the snapshot instead.

Both carry JSON-free string metadata in the safetensors header (format, policy, version, the
sha256 digest of the complete resulting state, tied-weight aliases) and a delta also names its
base delta file and that file's sha256, so a chain of deltas is a hash chain: a reader that trusts
the newest sha256 (from the WeightVersion event) can verify every older link. Either file may be
zstd-compressed as a whole; readers detect it by the zstd magic number.

Nothing here is pickled: tensors go through safetensors, everything else is strings and JSON.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SNAPSHOT_FORMAT = "astraflow-snapshot/1"
DELTA_FORMAT = "astraflow-delta/1"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
IDX, VAL, FULL = "::idx", "::val", "::full"
#: Largest decompressed file a reader accepts (a corrupt frame header must not exhaust memory).
MAX_DECOMPRESSED = 1 << 40
PUBLISH_DTYPES = ("bfloat16", "float16", "float32")
#: In a delta that is compressed, a tensor goes in full (`::full`) once this share of it changed.
COMPRESSED_FULL_FROM = 0.8


class FormatError(ValueError):
    """A snapshot or delta file is malformed (callers turn it into WeightIntegrityError)."""


def torch_dtype(name: str) -> torch.dtype:
    import torch

    if name not in PUBLISH_DTYPES:
        raise ValueError(f"unsupported weights dtype {name!r}; known: {', '.join(PUBLISH_DTYPES)}")
    return getattr(torch, name)


def int_view(t: torch.Tensor) -> torch.Tensor:
    """The same memory as signed integers of the same width: comparisons and copies on this view
    are comparisons and copies of raw bits (NaN payloads and -0.0 included)."""
    import torch

    by_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(by_size[t.element_size()])


def split_aliases(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tied duplicates (same storage, offset, shape and stride): returns the unique tensors and
    `{alias: canonical}`. The canonical name is the first in sorted order, so it is stable."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name in sorted(state):
        t = state[name]
        ident = (
            t.device.type,
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            t.stride(),
            t.dtype,
        )
        if t.numel() and ident in seen:
            aliases[name] = seen[ident]
        else:
            seen[ident] = name
            unique[name] = t
    return unique, aliases


def with_aliases(unique: dict[str, torch.Tensor], aliases: dict[str, str]) -> dict[str, torch.Tensor]:
    """The full state dict: aliases point at the very tensor of their canonical name."""
    out = dict(unique)
    for alias, canonical in aliases.items():
        out[alias] = unique[canonical]
    return out


def raw_bytes(t: torch.Tensor) -> bytes:
    import torch

    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def state_digest(unique: dict[str, torch.Tensor]) -> str:
    """sha256 over every unique tensor's name, dtype, shape and raw bytes, in sorted name order:
    two states with this digest are bit-identical."""
    h = hashlib.sha256()
    for name in sorted(unique):
        t = unique[name]
        h.update(f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0".encode())
        h.update(raw_bytes(t))
    return h.hexdigest()


def compress(data: bytes, level: int) -> bytes:
    if level <= 0:
        return data
    import zstandard

    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)


def decompress(data: bytes) -> bytes:
    if not data.startswith(ZSTD_MAGIC):
        return data
    import zstandard

    try:
        params = zstandard.get_frame_parameters(data)
        if params.content_size > MAX_DECOMPRESSED:
            raise FormatError(f"zstd frame claims {params.content_size} bytes")
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_DECOMPRESSED)
    except zstandard.ZstdError as exc:
        raise FormatError(f"corrupt zstd data: {exc}") from None


def read_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of an (uncompressed) safetensors buffer."""
    if len(data) < 8:
        raise FormatError("shorter than a safetensors header")
    (n,) = struct.unpack_from("<Q", data)
    if n > len(data) - 8 or n > 100 << 20:
        raise FormatError(f"safetensors header of {n} bytes does not fit in {len(data)} bytes")
    try:
        header = json.loads(bytes(data[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"safetensors header is not JSON: {exc}") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        raise FormatError("no astraflow metadata in the safetensors header")
    return meta


def decode_file(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and parsed metadata of a snapshot or delta file (compressed or not)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    raw = decompress(data)
    meta = read_metadata(raw)
    try:
        tensors = load(raw)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise FormatError(f"not a valid safetensors file: {exc}") from None
    parsed: dict[str, Any] = dict(meta)
    try:
        for key in ("version", "base", "changed", "total"):
            if key in meta:
                parsed[key] = int(meta[key])
        parsed["aliases"] = json.loads(meta.get("aliases", "{}"))
    except (ValueError, json.JSONDecodeError) as exc:
        raise FormatError(f"bad metadata: {exc}") from None
    if parsed.get("format") not in (SNAPSHOT_FORMAT, DELTA_FORMAT):
        raise FormatError(f"unknown format {meta.get('format')!r}")
    return tensors, parsed


#: safetensors' names of the dtypes a state may hold
_ST_DTYPES = {
    "bfloat16": "BF16",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "bool": "BOOL",
}
_HEADER_SIZE = struct.Struct("<Q")


def save(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """The safetensors file of `tensors` (read by `safetensors.torch.load`, as any safetensors file):
    an 8-byte header length, the JSON header padded to 8 bytes, then each tensor's raw bytes, widest
    dtype first so that every tensor is aligned. `safetensors.torch.save` does the same ~4x slower
    (per tensor it goes through numpy's ctypes): 3 ms of the trainer's CPU for each delta of the
    tiny recipe model, published every step."""
    import torch

    header: dict[str, Any] = {"__metadata__": metadata}
    parts: list[Any] = []
    offset = 0
    for name in sorted(tensors, key=lambda k: (-tensors[k].element_size(), k)):
        t = tensors[name].detach()
        if t.device.type != "cpu":
            t = t.cpu()
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        header[name] = {
            "dtype": _ST_DTYPES[str(t.dtype).removeprefix("torch.")],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + data.nbytes],
        }
        parts.append(data)
        offset += data.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return b"".join([_HEADER_SIZE.pack(len(head)), head, *parts])


def encode_snapshot(
    unique: dict[str, torch.Tensor], aliases: dict[str, str], policy: str, version: int, digest: str
) -> bytes:
    meta = {
        "format": SNAPSHOT_FORMAT,
        "policy": policy,
        "version": str(version),
        "state_sha256": digest,
        "aliases": json.dumps(aliases, sort_keys=True),
    }
    return save({k: v.contiguous() for k, v in unique.items()}, metadata=meta)


def diff_states(
    old: dict[str, torch.Tensor], new: dict[str, torch.Tensor], full_from: float | None = None
) -> tuple[dict[str, torch.Tensor], int, int]:
    """Changed elements of `new` against `old` as delta tensors; also (changed, total) counts.

    Per tensor, in numpy on its raw bits: count the changed elements first, and only for a tensor
    that goes sparse find them (`flatnonzero`, gap-coded). A tensor goes in full (`::full`) by the
    byte rule of the module's docstring, or, with `full_from`, once that share of its elements
    changed (compressed deltas). An RL step changes most elements of a small model, so most tensors
    go in full and their changed indices are never needed: locating every change in one flat
    buffer first took 5.3 ms of the trainer's CPU at each publication of the recipe model, this 2.6
    (with torch's `nonzero` instead of numpy's, 10x slower still). A tensor sent in full is a view
    of `new`'s memory, not a copy: the caller encodes the delta before it changes `new`."""
    import numpy as np
    import torch

    if set(old) != set(new):
        missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
        raise ValueError(f"tensor names changed between versions: missing {missing}, new {extra}")
    out: dict[str, torch.Tensor] = {}
    changed = total = 0
    for name in sorted(new):
        a, b = old[name], new[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"{name}: {a.dtype}{list(a.shape)} became {b.dtype}{list(b.shape)}")
        flat_new = _bits(b)
        differs = _bits(a) != flat_new
        numel = flat_new.size
        total += numel
        count = int(np.count_nonzero(differs))
        if not count:
            continue
        changed += count
        size = b.element_size()
        # in full where a value and a 2-byte gap per changed element would take the tensor's bytes
        in_full = count * (size + 2) >= numel * size if full_from is None else count >= full_from * numel
        if in_full:
            out[name + FULL] = torch.from_numpy(flat_new).view(b.dtype)
            continue
        idx = np.flatnonzero(differs)
        # gap code: differences within the tensor, its first changed index absolute
        gaps = np.empty_like(idx)
        gaps[0] = idx[0]
        np.subtract(idx[1:], idx[:-1], out=gaps[1:])
        out[name + IDX] = torch.from_numpy(_narrowest(gaps))
        out[name + VAL] = torch.from_numpy(flat_new[idx]).view(b.dtype)
    return out, changed, total


def _bits(t: torch.Tensor) -> Any:
    """A tensor's raw bits, flat, as a numpy array of signed integers of its element size."""
    return int_view(t.detach().cpu().contiguous()).reshape(-1).numpy()


def _narrowest(gaps: Any) -> Any:
    """Non-negative gaps (numpy int64) in the narrowest of int16/int32/int64 that holds them."""
    import numpy as np

    top = int(gaps.max())
    for dt in (np.int16, np.int32):
        if top <= np.iinfo(dt).max:
            return gaps.astype(dt)
    return gaps


def encode_delta(
    tensors: dict[str, torch.Tensor],
    aliases: dict[str, str],
    policy: str,
    version: int,
    base: int,
    base_delta: str,
    base_delta_sha256: str,
    digest: str,
    changed: int,
    total: int,
) -> bytes:
    meta = {
        "format": DELTA_FORMAT,
        "policy": policy,
        "version": str(version),
        "base": str(base),
        "base_delta": base_delta,
        "base_delta_sha256": base_delta_sha256,
        "state_sha256": digest,
        "changed": str(changed),
        "total": str(total),
        "aliases": json.dumps(aliases, sort_keys=True),
    }
    return save(tensors, metadata=meta)


def apply_delta(unique: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]) -> None:
    """Apply one delta in place to `unique` (which the caller owns). Raises FormatError if the delta
    does not fit the state (unknown tensor, wrong dtype, index out of range). In numpy, on the
    tensors' raw bits (with torch's cumsum and indexed assignment, 2x slower: a worker applies a
    delta at every version)."""
    import numpy as np
    import torch

    names = {k[: -len(IDX)] for k in tensors if k.endswith(IDX)}
    full = {k[: -len(FULL)] for k in tensors if k.endswith(FULL)}
    if len(names) * 2 + len(full) != len(tensors) or any(n + VAL not in tensors for n in names):
        raise FormatError(
            "delta tensors do not come in <name>::idx / <name>::val pairs or alone as <name>::full"
        )
    if names & full:
        raise FormatError(f"{sorted(names & full)[0]!r} is changed both in full and element by element")
    for name in sorted(names | full):
        if name not in unique:
            raise FormatError(f"delta changes {name!r}, which the base state does not have")
        target = unique[name]
        if name in full:
            val = tensors[name + FULL]
            if val.dtype != target.dtype or val.numel() != target.numel():
                raise FormatError(
                    f"{name}: {val.numel()} {val.dtype} values for a {target.numel()}-element "
                    f"{target.dtype} tensor"
                )
            _writable_bits(unique, name)[:] = _bits(val)
            continue
        val, gaps = tensors[name + VAL], tensors[name + IDX]
        if gaps.dtype not in (torch.int16, torch.int32, torch.int64):
            raise FormatError(f"{name}: indices of dtype {gaps.dtype}, not int16, int32 or int64")
        if val.dtype != target.dtype or val.numel() != gaps.numel():
            raise FormatError(
                f"{name}: {val.numel()} {val.dtype} values for {gaps.numel()} indices into {target.dtype}"
            )
        if not gaps.numel():
            continue
        steps = gaps.reshape(-1).numpy()
        idx = np.cumsum(steps, dtype=np.int64)
        if idx[0] < 0 or idx[-1] >= target.numel() or (steps[1:] <= 0).any():
            raise FormatError(f"{name}: indices are not increasing within [0, {target.numel()})")
        _writable_bits(unique, name)[idx] = _bits(val)


def _writable_bits(unique: dict[str, torch.Tensor], name: str) -> Any:
    """The raw bits of `unique[name]`, flat, as a numpy view of its own memory (made contiguous first)."""
    if not unique[name].is_contiguous():
        unique[name] = unique[name].contiguous()
    return int_view(unique[name]).reshape(-1).numpy()
