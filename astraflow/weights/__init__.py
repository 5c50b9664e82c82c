"""The weight store: how a trainer's weights reach the rollout workers (see DESIGN.md).

Weights never travel in Kafka; a WeightVersion event on the compacted `weights` topic carries the
URIs (file://, plain path or http://) and sha256 of a full safetensors snapshot and of a sparse
delta from the previous version. Readers (workers):

    from astraflow.weights import HeldWeights, WeightIntegrityError, fetch_weights
    held = fetch_weights(event, held)        # delta chain when possible, else snapshot + deltas
    model.load_state_dict(held.state)

Writer (the trainer): `WeightStore` (content-addressed directory with a per-policy manifest,
snapshots every K versions, deltas otherwise, pruning) and `WeightServer` (HTTP with Range).

Importing this package stays light: torch is loaded on first use of a torch-backed name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from astraflow.weights.transport import WeightIntegrityError, WeightNotFoundError, WeightStoreError

if TYPE_CHECKING:
    from astraflow.weights.fetch import HeldWeights, fetch_weights
    from astraflow.weights.server import WeightServer
    from astraflow.weights.store import WeightStore

_LAZY = {"HeldWeights": "fetch", "fetch_weights": "fetch", "WeightStore": "store", "WeightServer": "server"}

__all__ = [
    "HeldWeights",
    "WeightIntegrityError",
    "WeightNotFoundError",
    "WeightServer",
    "WeightStore",
    "WeightStoreError",
    "fetch_weights",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"astraflow.weights.{module}"), name)
