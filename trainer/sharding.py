"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for the trainer: `trainer.parallel: fsdp`.

Under DDP every rank holds the whole model and optimiser; under FSDP each rank holds 1/W of every
parameter and of its AdamW moments, and gathers a layer's parameters only while it runs. What
leaves the trainer must not depend on that choice: published weights and checkpoints are the FULL
state dicts, gathered on rank 0 (`full_state_dict=True, cpu_offload=True`), so a checkpoint stays
in the Hugging Face layout that `from_pretrained` loads, and the optimiser is saved in the same
index-keyed layout as `optimizer.state_dict()` of an unsharded model: a DDP run resumes an FSDP
checkpoint and the other way round. Gathering is a collective, so every rank must call
`full_state` at the same point (trainer/service.py does so at each publication and checkpoint).

Every rank also needs the same number of forward/backward passes per step (each pass all-gathers
parameters), unlike DDP where only the last micro-batch communicates: `TrainEngine.step` pads ranks
with fewer micro-batches with empty ones (no loss tokens, so no gradient).
"""

from __future__ import annotations

from typing import Any

import torch


def shard(model: torch.nn.Module) -> None:
    """Shard each decoder layer, then the rest (embeddings, final norm, head) as one root group.
    One group per layer lets a rank hold only one layer's full parameters at a time."""
    from torch.distributed.fsdp import fully_shard

    inner = getattr(model, "model", None)
    for layer in getattr(inner, "layers", None) or []:
        fully_shard(layer)
    fully_shard(model)


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _names(model: torch.nn.Module) -> list[str]:
    """Parameter names in the order the optimiser was given them (`model.parameters()`)."""
    return [name for name, _ in model.named_parameters()]


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The full model state dict on rank 0 (CPU tensors), None on the others. Collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options())
    return state if torch.distributed.get_rank() == 0 else None


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """The full optimiser state dict on rank 0, keyed by parameter index as an unsharded
    `optimizer.state_dict()` is; None on the others. Collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    named = get_optimizer_state_dict(model, optimizer, options=_options())
    if torch.distributed.get_rank() != 0:
        return None
    index = {name: i for i, name in enumerate(_names(model))}
    return {
        "state": {index[name]: value for name, value in named["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]],
    }


def load_full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load an index-keyed full optimiser state dict (every rank passes the whole of it; each keeps
    its shard). Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _names(model)
    named = {
        "state": {names[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [
            {**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(
        model, optimizer, optim_state_dict=named, options=StateDictOptions(full_state_dict=True)
    )


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (collective), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value
