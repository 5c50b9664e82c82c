"""Configuration models (pydantic): one per component, all gathered in a Recipe."""

from astraflow.config.base import StrictModel, load_model, read_yaml, validate_model
from astraflow.config.kafka import KafkaSettings
from astraflow.config.models import ModelSpec, TokenizerSpec
from astraflow.config.recipe import PolicySpec, Recipe, load_recipe

__all__ = [
    "KafkaSettings",
    "ModelSpec",
    "PolicySpec",
    "Recipe",
    "StrictModel",
    "TokenizerSpec",
    "load_model",
    "load_recipe",
    "read_yaml",
    "validate_model",
]
