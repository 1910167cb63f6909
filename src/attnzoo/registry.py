"""Name → class registries for attention mechanisms and positional schemes.

A registered class carries an ``Options`` dataclass: the typed, validated form of the free-form
``attention_options`` / ``position_options`` dict in :class:`attnzoo.ModelConfig`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T", bound=type)


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """For schemes that take no options."""


class Registry(Generic[T]):
    def __init__(self, kind: str, config_field: str):
        self.kind = kind
        self.config_field = config_field
        self._classes: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(cls: T) -> T:
            if name in self._classes:
                raise ValueError(f"{self.kind} {name!r} is already registered to {self._classes[name]}")
            cls.registry_name = name
            self._classes[name] = cls
            return cls

        return decorator

    def get(self, name: str) -> T:
        if name not in self._classes:
            raise ValueError(f"{self.config_field}={name!r} is not a known {self.kind}; choose one of {self.names()}")
        return self._classes[name]

    def names(self) -> list[str]:
        return sorted(self._classes)

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
