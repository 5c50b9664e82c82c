"""The one registry behind every name a recipe uses for a swappable part: data algorithms
(`streams.pipeline`), environments (`feeder.env`) and workflows (`worker.workflow`).

Each component declares its own instance (`streams.registry.ALGORITHMS`,
`workers.registry.ENVIRONMENTS` and `WORKFLOWS`) with its built-ins as "module:attribute" strings
and an entry point group for third-party packages. The rules are the same for all three:

- lazy: nothing is imported until a recipe names it, built-ins included;
- a plug-in cannot shadow a built-in: naming a built-in that a plug-in also declares fails with
  an error naming both, so a recipe never silently runs code other than what its author read;
- a broken plug-in fails only the recipe that names it (its import error is wrapped in a
  ConfigError naming the plug-in); recipes naming other entries still load;
- an unknown name fails with the list of known ones.

Entry points are scanned once per registry, on first use; the scan reads package metadata and
imports nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from importlib import metadata
from typing import Any

from astraflow.errors import ConfigError


def _describe(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{ep.value} (package {dist.name})" if dist is not None else ep.value


class Registry:
    """Names -> factories (normally classes) of one kind, from built-ins, entry points and
    in-process registrations (tests, benches)."""

    def __init__(self, kind: str, group: str, builtins: dict[str, str]) -> None:
        self.kind = kind  # "algorithm", "environment", "workflow": used in error messages
        self.group = group  # the entry point group plug-ins declare themselves under
        self.builtins = dict(builtins)
        #: registered in-process by `register` (or by assignment, as the benches do)
        self.local: dict[str, Any] = {}
        self._plugins: dict[str, list[metadata.EntryPoint]] | None = None
        self._loaded: dict[str, Any] = {}

    def plugins(self) -> dict[str, list[metadata.EntryPoint]]:
        """The group's entry points by name (more than one where packages collide); not loaded."""
        if self._plugins is None:
            found: dict[str, list[metadata.EntryPoint]] = {}
            for ep in _entry_points(self.group):
                found.setdefault(ep.name, []).append(ep)
            self._plugins = found
        return self._plugins

    def names(self) -> list[str]:
        return sorted({*self.builtins, *self.plugins(), *self.local})

    def register(self, name: str, factory: Any) -> None:
        """Add an in-process entry. A built-in or plug-in name is refused."""
        if name in self.builtins or name in self.plugins():
            raise ConfigError(
                f"cannot register {self.kind} {name!r}: the name is taken by {self._providers(name)[0]}"
            )
        self.local[name] = factory

    def get(self, name: str) -> Any:
        """The factory registered under `name`, imported on first use."""
        if name in self._loaded and name not in self.local:  # checked when loaded; the scan is fixed
            return self._loaded[name]
        providers = self._providers(name)
        if not providers:
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        if len(providers) > 1:
            what = "a plug-in cannot shadow a built-in" if name in self.builtins else "rename one of them"
            raise ConfigError(
                f"{self.kind} {name!r} is declared twice, by {' and by '.join(providers)}: "
                f"{what} (entry point group {self.group})"
            )
        if name in self.local:
            return self.local[name]
        if name in self.builtins:
            module, _, attr = self.builtins[name].partition(":")
            factory = getattr(importlib.import_module(module), attr)
        else:
            ep = self.plugins()[name][0]
            try:
                factory = ep.load()
            except Exception as exc:  # the plug-in's own bug: it fails the recipes naming it, no others
                raise ConfigError(
                    f"plug-in {self.kind} {name!r} from {_describe(ep)} failed to load: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        self._loaded[name] = factory
        return factory

    def _providers(self, name: str) -> list[str]:
        found = [f"the built-in {self.builtins[name]}"] if name in self.builtins else []
        found += [f"the plug-in {_describe(ep)}" for ep in self.plugins().get(name, [])]
        if name in self.local:
            found.append(f"the in-process registration {self.local[name]!r}")
        return found


def _entry_points(group: str) -> Iterable[metadata.EntryPoint]:
    """One entry per (name, target): the same target declared twice is the same code, no conflict."""
    seen: set[tuple[str, str]] = set()
    for ep in metadata.entry_points(group=group):
        if (ep.name, ep.value) not in seen:
            seen.add((ep.name, ep.value))
            yield ep
