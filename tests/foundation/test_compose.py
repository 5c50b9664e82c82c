"""docker-compose.yml: no Docker engine runs here, so the file is validated against the compose
schema (docker-compose v1's offline `config`) and cross-checked with the project: every service
command is a real `astraflow` CLI invocation, every recipe it names loads, every topic and policy it
names is in topics.yaml / the recipe, and the Kafka image matches the local broker's version."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from astraflow import topics
from astraflow.broker import kafka_version
from astraflow.cli import app
from astraflow.config import load_recipe
from tests.conftest import REPO, subprocess_env

COMPOSE_FILES = sorted(REPO.glob("docker-compose*.yml")) + sorted((REPO / "deploy").glob("**/*compose*.yml"))


def resolved(path: Path) -> dict:
    assert shutil.which("docker-compose"), "docker-compose (Debian package) validates compose files: `make install`"
    # A compose file with required variables ships an example env file beside it.
    env_files = [arg for f in sorted(path.parent.glob("*.env.example")) for arg in ("--env-file", str(f))]
    result = subprocess.run(["docker-compose", *env_files, "-f", str(path), "config"], capture_output=True,
                            text=True, cwd=path.parent, env=subprocess_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def parse_cli(args: list[str]) -> tuple[Any, Any]:
    """Resolve `astraflow ARGS` to its command and parse every option (types, required ones), as
    the CLI would. (typer vendors its own click, so groups are recognised by duck typing.)"""
    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("astraflow", list(args))
    while hasattr(cmd, "resolve_command"):
        rest = [*ctx._protected_args, *ctx.args]  # noqa: SLF001 - click keeps the sub-command here
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert sub is not None, f"unknown command {name}"
        cmd, ctx = sub, sub.make_context(name, rest, parent=ctx)
    return cmd, ctx


def is_usage_error(exc: BaseException) -> bool:
    return any(cls.__name__ == "UsageError" for cls in type(exc).__mro__)


def test_parse_cli_rejects_what_the_cli_rejects() -> None:
    for bad in (["topics", "aply"], ["broker", "start", "--prot", "1"], ["broker", "start", "--port", "x"],
                ["trainer", "--recipe", "r.yaml"]):  # the last lacks the required --policy
        with pytest.raises(Exception) as info:  # noqa: B017 - the class lives in typer's vendored click
            parse_cli(bad)
        assert is_usage_error(info.value), (bad, info.value)
    cmd, ctx = parse_cli(["broker", "start", "--port", "0"])
    assert cmd.name == "start" and ctx.params["port"] == 0


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_compose_file_is_valid_and_matches_the_project(path: Path) -> None:
    config = resolved(path)
    services = config["services"]
    spec = topics.load_spec()
    seen_commands = set()
    for name, svc in services.items():
        image = svc.get("image", "")
        if image.startswith("apache/kafka"):
            assert image == f"apache/kafka:{kafka_version()}", "compose and the local broker run the same Kafka"
            env = svc["environment"]
            assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
            assert str(env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]) == "false"
            continue
        command = svc["command"]
        assert command[0] == "astraflow", f"{name}: runs the CLI"
        cmd, ctx = parse_cli(command[1:])
        seen_commands.add(cmd.name)
        recipe = ctx.params.get("recipe")
        if recipe is not None:
            loaded = load_recipe(REPO / recipe)
            names = {s.name for s in topics.expand(spec, loaded.policy_names)}
            policy = ctx.params.get("policy")
            if policy is not None:
                assert policy in loaded.policy_names, f"{name}: policy {policy} is not in {recipe}"
                assert f"samples.{policy}" in names
    if path == REPO / "docker-compose.yml":
        assert {"apply", "streams", "trainer", "worker", "feed"} <= seen_commands
    else:  # a region: workers only, reaching the cluster over SASL_SSL
        assert seen_commands == {"worker"}
        for svc in services.values():
            assert svc["environment"]["ASTRAFLOW_SECURITY_PROTOCOL"] == "SASL_SSL"
            assert svc["environment"]["ASTRAFLOW_REGION"]
