"""Every YAML file in the repository is parsed and validated by the loader that uses it.

A YAML file this test does not know is a failure: add its validator here when you add the file.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from astraflow import topics
from astraflow.config import load_recipe
from tests.conftest import REPO
from tests.foundation.test_compose import resolved


def tracked_yaml() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.yml", "*.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(REPO / line for line in out.splitlines() if line and (REPO / line).exists())


def validate(path: Path) -> None:
    rel = path.relative_to(REPO).as_posix()
    if rel == "topics.yaml":
        topics.expand(topics.load_spec(path), ["policy"])
    elif rel.startswith("recipes/"):
        recipe = load_recipe(path)
        assert recipe.name == path.stem, f"{rel}: the recipe's name should match its file name"
    elif "compose" in path.name:
        resolved(path)
    else:
        pytest.fail(f"{rel}: no validator for this YAML file; add one in {__file__}")


@pytest.mark.parametrize("path", tracked_yaml(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_yaml_file_is_valid(path: Path) -> None:
    validate(path)


def test_there_are_yaml_files_to_check() -> None:
    names = {p.relative_to(REPO).as_posix() for p in tracked_yaml()}
    assert {"topics.yaml", "docker-compose.yml", "recipes/arithmetic.yaml"} <= names
