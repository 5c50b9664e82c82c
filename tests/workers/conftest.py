"""Fixtures of the workers tests: a very small model (hidden 32, 1 layer) so several workers fit on
two cores, its checkpoint, and a recipe factory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from astraflow.config import ModelSpec, Recipe, validate_model

TINY = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 1,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
}


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers.utils import logging as hf_logging

    from astraflow.models import init_checkpoint

    hf_logging.disable_progress_bar()
    return init_checkpoint(ModelSpec(**TINY), tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="session")
def codec(tiny_checkpoint: Path) -> Any:
    from workers.envs.base import Codec, load_tokenizer

    return Codec(load_tokenizer(tiny_checkpoint))


def make_recipe(**sections: Any) -> Recipe:
    data: dict[str, Any] = {"name": "wtest", "model": dict(TINY)}
    data.update(sections)
    return validate_model(Recipe, data, "test recipe")
