"""Strict pydantic base for every config model, and YAML loading with errors that name the file
and the key.

Every config object is frozen and forbids unknown keys: a typo in a recipe is an error at load
time, never a silently ignored setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from astraflow.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Frozen, no unknown keys, validated defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{loc}'")
        elif err["type"] == "missing":
            lines.append(f"{source}: missing required key '{loc}'")
        elif err["type"] == "union_tag_invalid":  # a `type` that chooses none of the union's members
            known = str(err["ctx"]["expected_tags"]).replace("'", "")
            lines.append(f"{source}: {loc}: unknown type {err['ctx']['tag']!r}; known: {known}")
        elif err["type"] == "union_tag_not_found":
            lines.append(f"{source}: {loc}: expected a mapping with a `type`, got {err['input']!r:.80}")
        else:
            lines.append(f"{source}: {loc}: {err['msg']}")
    return "\n".join(lines)


def validate_model(model: type[M], data: Any, source: str) -> M:
    """Validate `data` as `model`; a failure is a ConfigError naming `source` and each bad key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; unreadable or malformed files are ConfigErrors naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def load_model(model: type[M], path: str | Path) -> M:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return validate_model(model, data, str(path))
