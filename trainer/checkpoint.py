"""Trainer checkpoints, written atomically: a crash leaves the previous checkpoint intact.

    <run>/trainer/<policy>/checkpoints/step-00000012/
        config.json, generation_config.json, model.safetensors   (transformers save_pretrained)
        tokenizer.json, tokenizer_config.json, ...               (loads with AutoTokenizer)
        optimizer.safetensors + optimizer.json                   (AdamW moments + param groups)
        trainer_state.json                                        (step, version, offsets, dedupe)

Everything is written into a hidden temporary directory, fsynced, then renamed into place, so a
directory named `step-*` is always complete. Nothing is pickled: tensors go in safetensors, the
rest in JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

STEP_RE = re.compile(r"^step-(\d{8})$")
STATE_FILE = "trainer_state.json"


def optimizer_to_files(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An index-keyed AdamW state dict (`optimizer.state_dict()`, or the full one FSDP gathers) as
    safetensors-ready tensors (copies: training may go on) plus JSON-ready metadata."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value.detach().to("cpu", copy=True).contiguous()
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def copy_state(model_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A model state dict as CPU copies, tied tensors still sharing one copy (so
    `save_pretrained` sees them tied, as it would the live model)."""
    copies: dict[int, torch.Tensor] = {}
    out = {}
    for name, tensor in model_state.items():
        ptr = tensor.data_ptr()
        if ptr not in copies:
            copies[ptr] = tensor.detach().to("cpu", copy=True)
        out[name] = copies[ptr]
    return out


@dataclass
class Snapshot:
    """Everything a checkpoint holds, copied at the end of a step, so it can be written while the
    next step trains."""

    step: int
    model_state: dict[str, torch.Tensor]
    optimizer_tensors: dict[str, torch.Tensor] | None  # None: a publication's snapshot, no checkpoint
    optimizer_meta: dict[str, Any] | None
    state: dict[str, Any]


def snapshot(
    step: int,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any] | None,
    state: dict[str, Any],
) -> Snapshot:
    """Copies of `TrainEngine.full_state()` (model and optimiser state dicts; no optimiser state for a
    publication that is not checkpointed) and the trainer's state."""
    tensors, meta = optimizer_to_files(optimizer_state) if optimizer_state is not None else (None, None)
    return Snapshot(step, copy_state(model_state), tensors, meta, state)


def optimizer_from_files(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """The index-keyed optimiser state dict that `optimizer_to_files` wrote."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in [*tensors.items(), *meta["scalars"].items()]:
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def save_checkpoint(
    root: Path,
    snap: Snapshot,
    model: Any,
    tokenizer: Any,
    keep: int = 2,
    before_rename: Callable[[], None] | None = None,
) -> Path:
    """Write the checkpoint of `snap` under `root` atomically and keep only the newest `keep`.
    `model` gives only the config (its weights are taken from the snapshot). `before_rename` runs
    once the files are synced, before the rename makes them the checkpoint (fault injection)."""
    from safetensors.torch import save_file

    step, state = snap.step, snap.state
    if snap.optimizer_tensors is None:
        raise ValueError(f"the snapshot of step {step} has no optimiser state: it cannot be a checkpoint")
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        model.save_pretrained(tmp, state_dict=snap.model_state)
        tokenizer.save_pretrained(tmp)
        save_file(snap.optimizer_tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(snap.optimizer_meta, indent=1))
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=1))
        _fsync_tree(tmp)
        if before_rename is not None:
            before_rename()
        if final.exists():  # only a leftover of a run whose later checkpoints were all lost
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)  # the rename is durable; the files were synced before it
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stray in root.glob(".step-*"):  # temporaries of a writer that crashed
        if stray != tmp:
            shutil.rmtree(stray, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not root.exists():
        return []
    found = [p for p in root.iterdir() if STEP_RE.match(p.name) and (p / STATE_FILE).exists()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_FILE).read_text())


def read_optimizer(path: Path) -> dict[str, Any]:
    """The checkpoint's optimiser state dict (for `TrainEngine.load_optimizer`)."""
    from safetensors.torch import load_file

    meta = json.loads((path / "optimizer.json").read_text())
    return optimizer_from_files(load_file(str(path / "optimizer.safetensors")), meta)
