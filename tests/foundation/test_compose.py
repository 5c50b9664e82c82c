"""docker-compose.yml, deploy/region's compose file and the file `astraflow compose` writes for every
recipe under recipes/: no Docker engine runs here, so each is validated against the compose schema
(docker-compose v1's offline `config`) and cross-checked with the project: every service command is
a real `astraflow` CLI invocation, every recipe it names loads, every topic and policy it names is in
topics.yaml / the recipe, the Kafka image matches the local broker's version, and a recipe's file
runs exactly one trainer per policy."""

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
from astraflow.compose import compose_for, write_compose
from astraflow.config import load_recipe
from astraflow.errors import ConfigError
from tests.conftest import REPO, subprocess_env

# the committed files (docker-compose.<recipe>.yml files that `astraflow compose` wrote are not)
COMPOSE_FILES = [REPO / "docker-compose.yml", *sorted((REPO / "deploy").glob("**/*compose*.yml"))]
RECIPES = sorted((REPO / "recipes").glob("**/*.yaml"))


def resolved(path: Path) -> dict:
    assert shutil.which("docker-compose"), (
        "docker-compose (Debian package) validates compose files: `make install`"
    )
    # A compose file with required variables ships an example env file beside it.
    env_files = [arg for f in sorted(path.parent.glob("*.env.example")) for arg in ("--env-file", str(f))]
    result = subprocess.run(
        ["docker-compose", *env_files, "-f", str(path), "config"],
        capture_output=True,
        text=True,
        cwd=path.parent,
        env=subprocess_env(),
        timeout=60,
    )
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
    for bad in (
        ["topics", "aply"],
        ["broker", "start", "--prot", "1"],
        ["broker", "start", "--port", "x"],
        ["trainer", "--recipe", "r.yaml"],
    ):  # the last lacks the required --policy
        with pytest.raises(Exception) as info:  # noqa: B017 - the class lives in typer's vendored click
            parse_cli(bad)
        assert is_usage_error(info.value), (bad, info.value)
    cmd, ctx = parse_cli(["broker", "start", "--port", "0"])
    assert cmd.name == "start" and ctx.params["port"] == 0


def check_services(services: dict[str, Any]) -> dict[str, Any]:
    """Check every service against the project; returns {service: parsed CLI params} of the
    `astraflow` services, with the command's name under "_command"."""
    spec = topics.load_spec()
    parsed = {}
    for name, svc in services.items():
        image = svc.get("image", "")
        if image.startswith("apache/kafka"):
            assert image == f"apache/kafka:{kafka_version()}", (
                "compose and the local broker run the same Kafka"
            )
            env = svc["environment"]
            assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
            assert str(env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]) == "false"
            continue
        command = svc["command"]
        assert command[0] == "astraflow", f"{name}: runs the CLI"
        cmd, ctx = parse_cli(command[1:])
        parsed[name] = {**ctx.params, "_command": cmd.name}
        recipe = ctx.params.get("recipe")
        if recipe is not None:
            loaded = load_recipe(REPO / recipe)
            names = {s.name for s in topics.expand(spec, loaded.policy_names)}
            policy = ctx.params.get("policy")
            if policy is not None:
                assert policy in loaded.policy_names, f"{name}: policy {policy} is not in {recipe}"
                assert f"samples.{policy}" in names
    return parsed


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_compose_file_is_valid_and_matches_the_project(path: Path) -> None:
    config = resolved(path)
    services = config["services"]
    seen_commands = {p["_command"] for p in check_services(services).values()}
    if path == REPO / "docker-compose.yml":
        assert {"apply", "streams", "trainer", "worker", "feed"} <= seen_commands
    else:  # a region: workers only, reaching the cluster over SASL_SSL
        assert seen_commands == {"worker"}
        for svc in services.values():
            assert svc["environment"]["ASTRAFLOW_SECURITY_PROTOCOL"] == "SASL_SSL"
            assert svc["environment"]["ASTRAFLOW_REGION"]


@pytest.mark.parametrize("recipe_path", RECIPES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_recipe_has_a_valid_compose_with_one_trainer_per_policy(
    recipe_path: Path, tmp_path: Path
) -> None:
    recipe = load_recipe(recipe_path)
    rel = recipe_path.relative_to(REPO).as_posix()
    written = tmp_path / "deploy" / f"docker-compose.{recipe.name}.yml"
    written.parent.mkdir()
    write_compose(recipe_path, REPO / "docker-compose.yml", written)
    services = resolved(written)["services"]
    parsed = check_services(services)
    trainers = {name: p for name, p in parsed.items() if p["_command"] == "trainer"}
    assert {name: p["policy"] for name, p in trainers.items()} == {
        f"trainer-{p}": p for p in recipe.policy_names
    }
    assert {p["_command"] for p in parsed.values()} == {"apply", "streams", "trainer", "worker", "feed"}
    for name, p in parsed.items():  # every component runs this recipe, from the image's copy
        assert p["recipe"] == Path(rel), name
        assert Path(services[name]["build"]["context"]) == REPO, "the build context is the repository"
    assert services["worker"]["deploy"]["replicas"] == recipe.worker.count


def test_the_default_recipe_compose_is_docker_compose_yml(tmp_path: Path) -> None:
    """For the default recipe the generated file and docker-compose.yml run the same services, the
    trainer renamed `trainer-solver`: the generator takes everything else from the base unchanged."""
    base = resolved(REPO / "docker-compose.yml")["services"]
    write_compose(REPO / "recipes" / "arithmetic.yaml", REPO / "docker-compose.yml", tmp_path / "c.yml")
    generated = resolved(tmp_path / "c.yml")["services"]
    assert generated.pop("trainer-solver") == base.pop("trainer")
    assert generated == base


def test_compose_refuses_what_it_cannot_build(tmp_path: Path) -> None:
    outside = tmp_path / "mine.yaml"
    outside.write_text((REPO / "recipes" / "arithmetic.yaml").read_text())
    with pytest.raises(ConfigError, match="not under"):  # the image holds recipes/ only
        write_compose(outside, REPO / "docker-compose.yml", tmp_path / "c.yml")
    recipe = load_recipe(REPO / "recipes" / "solve_and_verify.yaml")
    with pytest.raises(ConfigError, match="no `trainer` service"):
        compose_for({"services": {"worker": {"command": ["astraflow", "worker"]}}}, recipe, "r.yaml", ".")
    with pytest.raises(ConfigError, match="--policy"):
        compose_for({"services": {"trainer": {"command": ["astraflow", "trainer"]}}}, recipe, "r.yaml", ".")


def test_compose_moves_build_contexts_to_where_the_file_is_written() -> None:
    recipe = load_recipe(REPO / "recipes" / "solve_and_verify.yaml")
    base = {
        "services": {
            "trainer": {
                "build": {"context": "app", "args": {"X": "1"}},
                "command": ["astraflow", "trainer", "--policy", "p"],
            },
            "feeder": {"build": ".", "command": ["astraflow", "feed"]},
        }
    }
    out = compose_for(base, recipe, "recipes/solve_and_verify.yaml", "..")
    assert out["services"]["trainer-verifier"]["build"] == {"context": "../app", "args": {"X": "1"}}
    assert out["services"]["feeder"]["build"] == ".."
    assert base["services"]["trainer"]["build"]["context"] == "app"  # the base is left as it was


def test_compose_cli_writes_beside_the_base(tmp_path: Path) -> None:
    """`astraflow compose` with no --output writes docker-compose.<name>.yml beside the base."""
    from typer.testing import CliRunner

    base = tmp_path / "docker-compose.yml"
    base.write_text((REPO / "docker-compose.yml").read_text())
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "game.yaml"
    recipe.write_text((REPO / "recipes" / "referential_game.yaml").read_text())
    result = CliRunner().invoke(app, ["compose", "--recipe", str(recipe), "--base", str(base)])
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((tmp_path / "docker-compose.referential_game.yml").read_text())
    assert [n for n in written["services"] if n.startswith("trainer")] == [
        "trainer-speaker",
        "trainer-listener",
    ]
    assert written["services"]["feeder"]["command"][-1] == "recipes/game.yaml"
    assert written["services"]["feeder"]["build"] == "."
