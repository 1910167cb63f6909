"""Name → record registries: attention mechanisms and positional schemes (classes), attention kernels (records).

A registered mechanism or scheme class carries an ``Options`` dataclass: the typed, validated form of the free-form
``attention_options`` / ``position_options`` dict in :class:`attnzoo.ModelConfig`.

Other packages add to a registry through Python entry points (groups ``attnzoo.attention``, ``attnzoo.positions``
and ``attnzoo.kernels``), named by the registered name and pointing at the class or record, or at a module that
registers it::

    [project.entry-points."attnzoo.attention"]
    my_attention = "my_package.attention:MyAttention"

They are loaded lazily: :meth:`Registry.names` lists them without importing anything, and :meth:`Registry.get`
imports one the first time its name is asked for. The installed distributions are scanned once per ``sys.path``
(a scan reads every distribution's metadata, about 24 ms here, and each variant label asks twice).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable
from importlib import metadata
from types import ModuleType
from typing import Any, Generic, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """For schemes that take no options."""


class Registry(Generic[T]):
    def __init__(self, kind: str, config_field: str, entry_point_group: str | None = None):
        self.kind = kind
        self.config_field = config_field
        self.entry_point_group = entry_point_group
        self._classes: dict[str, T] = {}
        self._clashes_told = False
        self._entry_points: dict[str, metadata.EntryPoint] = {}
        self._scanned_path: tuple[str, ...] | None = None  # the sys.path the entry points were read under
        self._adopt: Callable[[Any, str], T] | None = None  # see adopt_plugins_with

    def adopt_plugins_with(self, adopt: Callable[[Any, str], T]) -> None:
        """Pass what a plugin's entry point registers through ``adopt(loaded, where)`` first: it returns what is
        registered (checked, its code wrapped) or raises ValueError naming ``where``, the plugin and its entry
        point."""
        self._adopt = adopt

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(cls: T) -> T:
            if name in self._classes:
                raise ValueError(f"{self.kind} {name!r} is already registered to {self._classes[name]}")
            if isinstance(cls, type):  # a record (a kernel) carries its name as a field
                cls.registry_name = name
            self._classes[name] = cls
            return cls

        return decorator

    def get(self, name: str) -> T:
        self._tell_clashes()
        if name not in self._classes:
            self._load_plugin(name)
        if name not in self._classes:
            raise ValueError(f"{self.config_field}={name!r} is not a known {self.kind}; choose one of {self.names()}")
        return self._classes[name]

    def registered(self) -> dict[str, T]:
        """The classes or records registered so far, the plugins loaded so far included; imports nothing."""
        return dict(self._classes)

    def names(self) -> list[str]:
        """The registered names and those of the installed plugins (not imported by this)."""
        return sorted(set(self._classes) | set(self._plugins()))

    def _plugins(self) -> dict[str, metadata.EntryPoint]:
        if self.entry_point_group is None:
            return {}
        if self._scanned_path != tuple(sys.path):
            self._entry_points = {ep.name: ep for ep in metadata.entry_points(group=self.entry_point_group)}
            self._scanned_path = tuple(sys.path)
        return self._entry_points

    def _tell_clashes(self) -> None:
        """Warn, once, of plugins named like a registered class: the registered one wins, so they never load."""
        if self._clashes_told:
            return
        self._clashes_told = True
        for name, entry_point in sorted(self._plugins().items()):
            if name in self._classes:
                logger.warning(
                    "warning: the %s plugin %s = %r (entry point group %s) is not loaded: %r is built in; "
                    "rename its entry point",
                    self.kind, name, entry_point.value, self.entry_point_group, name,
                )  # fmt: skip

    def _load_plugin(self, name: str) -> None:
        """Import the plugin entry point named ``name``, if one is installed; a class or record it points at is
        registered under that name, a module is expected to register it itself."""
        entry_point = self._plugins().get(name)
        if entry_point is None:
            return
        where = f"the {self.kind} plugin {name} = {entry_point.value!r} (entry point group {self.entry_point_group})"
        try:
            loaded = entry_point.load()
        except SystemExit as stop:  # its module ends the process on import: say so rather than exit silently
            raise ValueError(f"{where} failed to load: it called sys.exit({stop.code!r}) on import") from None
        except KeyboardInterrupt:  # "interrupted" alone would not say where: name the plugin that was loading
            raise ValueError(
                f"{where} failed to load: KeyboardInterrupt while it was imported (a Ctrl-C then, or its module "
                "raised it)"
            ) from None
        except Exception as err:  # an ImportError, or anything the plugin's module raises on import
            raise ValueError(f"{where} failed to load: {err!r}") from err
        if name in self._classes:  # its module registered it
            loaded = self._classes.pop(name)
        elif isinstance(loaded, ModuleType):
            raise ValueError(
                f"{where} was imported but registered nothing under {name!r}: point the entry point at the class, "
                f"or register the class in that module under this name"
            )
        self.register(name)(loaded if self._adopt is None else self._adopt(loaded, where))

    def parse_options(self, name: str, options: dict[str, Any]) -> Any:
        """Build the typed options of ``name`` from a dict, naming any bad key and the allowed ones."""
        options_cls = self.get(name).Options
        options_field = f"{self.config_field}_options"
        allowed = [f.name for f in dataclasses.fields(options_cls)]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(
                f"{options_field} has unknown option(s) {unknown} for {self.kind} {name!r}; "
                f"allowed: {allowed or 'none'}"
            )
        try:
            return options_cls(**options)
        except (ValueError, TypeError) as err:  # TypeError: a comparison on a value of the wrong type
            raise ValueError(f"{options_field} for {self.kind} {name!r}: {err}") from None
