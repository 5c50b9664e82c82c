"""The four rules of `astraflow.registry`, with plug-ins installed for real: a package's module and
its `.dist-info` (entry_points.txt) written to a temporary directory put on sys.path, so the
entry points come through `importlib.metadata` exactly as a pip-installed package's would."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from astraflow.config.streams import StageConfig, StreamsConfig
from astraflow.errors import ConfigError
from astraflow.registry import Registry
from streams import registry as streams_registry
from streams.api import StageContext
from streams.pipeline import build_pipeline
from workers import registry as workers_registry


class Plugins:
    """Writes modules and installs packages declaring entry points into one sys.path directory."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.group = root, f"astraflow.test_{uuid.uuid4().hex[:8]}"
        monkeypatch.syspath_prepend(str(root))

    def module(self, source: str) -> str:
        """A fresh, not yet imported module with `source`; returns its name."""
        name = f"regmod_{uuid.uuid4().hex[:10]}"
        (self.root / f"{name}.py").write_text(source)
        return name

    def package(self, dist: str, entries: dict[str, str], group: str | None = None) -> None:
        info = self.root / f"{dist.replace('-', '_')}-0.1.dist-info"  # as pip names it
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
        (info / "entry_points.txt").write_text(f"[{group or self.group}]\n{lines}")


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Plugins:
    return Plugins(tmp_path, monkeypatch)


THING = "class Thing:\n    pass\n"
BROKEN = "raise ImportError('needs libfoo, which is not installed')\n"


def test_nothing_is_imported_until_named(plugins: Plugins) -> None:
    builtin, plugin = plugins.module(THING), plugins.module(THING)
    plugins.package("lazy-pkg", {"extra": f"{plugin}:Thing"})
    reg = Registry("widget", plugins.group, {"thing": f"{builtin}:Thing"})
    assert reg.names() == ["extra", "thing"]
    assert builtin not in sys.modules and plugin not in sys.modules
    assert reg.get("thing").__module__ == builtin
    assert plugin not in sys.modules  # naming one entry imports only that one
    assert reg.get("extra").__module__ == plugin
    assert reg.get("extra") is reg.get("extra")


def test_a_plugin_cannot_shadow_a_builtin(plugins: Plugins) -> None:
    builtin, evil = plugins.module(THING), plugins.module(THING)
    plugins.package("evil-pkg", {"thing": f"{evil}:Thing", "other": f"{evil}:Thing"})
    reg = Registry("widget", plugins.group, {"thing": f"{builtin}:Thing"})
    with pytest.raises(ConfigError) as err:
        reg.get("thing")
    msg = str(err.value)
    assert f"built-in {builtin}:Thing" in msg and f"plug-in {evil}:Thing (package evil-pkg)" in msg, msg
    assert "cannot shadow a built-in" in msg
    assert evil not in sys.modules and builtin not in sys.modules  # refused before importing either
    assert reg.get("other").__name__ == "Thing"  # the package's other entries still work
    with pytest.raises(ConfigError, match=f"taken by the built-in {builtin}:Thing"):
        reg.register("thing", object)


def test_two_plugins_declaring_one_name_are_both_named(plugins: Plugins) -> None:
    a, b = plugins.module(THING), plugins.module(THING)
    plugins.package("pkg-a", {"dup": f"{a}:Thing"})
    plugins.package("pkg-b", {"dup": f"{b}:Thing"})
    with pytest.raises(ConfigError, match="declared twice") as err:
        Registry("widget", plugins.group, {}).get("dup")
    assert "(package pkg-a)" in str(err.value) and "(package pkg-b)" in str(err.value)


def test_a_broken_plugin_fails_only_what_names_it(plugins: Plugins) -> None:
    good, bad = plugins.module(THING), plugins.module(BROKEN)
    plugins.package("broken-pkg", {"broken": f"{bad}:Thing"})
    plugins.package("good-pkg", {"good": f"{good}:Thing"})
    reg = Registry("widget", plugins.group, {})
    assert reg.names() == ["broken", "good"]  # listing does not import
    with pytest.raises(ConfigError) as err:
        reg.get("broken")
    msg = str(err.value)
    assert f"plug-in widget 'broken' from {bad}:Thing (package broken-pkg) failed to load" in msg
    assert "ImportError: needs libfoo" in msg
    assert reg.get("good").__module__ == good


def test_an_unknown_name_lists_the_known_ones(plugins: Plugins) -> None:
    plugins.package("some-pkg", {"from_plugin": "x:Y"})
    reg = Registry("widget", plugins.group, {"b": "x:Y", "a": "x:Y"})
    reg.register("local_one", object)
    with pytest.raises(ConfigError, match=r"^unknown widget 'c'; known: a, b, from_plugin, local_one$"):
        reg.get("c")


def test_broken_plugins_fail_only_the_recipes_naming_them(
    plugins: Plugins, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The component registries, end to end: a pipeline or worker recipe naming a broken plug-in
    fails at load time; one naming only built-ins is unaffected by it."""
    bad = plugins.module(BROKEN)
    plugins.package("broken-algo", {"broken_algo": f"{bad}:Thing"}, streams_registry.ENTRY_POINT_GROUP)
    plugins.package("broken-env", {"broken_env": f"{bad}:Thing"}, workers_registry.ENVIRONMENTS.group)
    for reg in (streams_registry.ALGORITHMS, workers_registry.ENVIRONMENTS):
        monkeypatch.setattr(reg, "_plugins", None)  # rescan with the test's packages; restored after
    ctx = StageContext(policies=["policy"], max_staleness=2)

    def pipeline(*names: str) -> StreamsConfig:
        return StreamsConfig(pipeline=[StageConfig(name=n) for n in names])

    with pytest.raises(
        ConfigError, match=r"streams.pipeline\[0\] \(broken_algo\): plug-in algorithm 'broken_algo'"
    ):
        build_pipeline(pipeline("broken_algo", "grpo"), ctx)
    assert build_pipeline(pipeline("grpo"), ctx).names[2] == "grpo"
    with pytest.raises(ConfigError, match="plug-in environment 'broken_env' from .*broken-env"):
        workers_registry.environment_class("broken_env")
    assert workers_registry.environment_class("arithmetic").__name__ == "ArithmeticEnv"


@pytest.mark.parametrize(
    "reg",
    [streams_registry.ALGORITHMS, workers_registry.ENVIRONMENTS, workers_registry.WORKFLOWS],
    ids=lambda r: r.kind,
)
def test_every_builtin_target_exists(reg: Registry) -> None:
    """Built-ins are strings until named; a typo would only show when a recipe names it."""
    for name in reg.builtins:
        assert callable(reg.get(name)), name
