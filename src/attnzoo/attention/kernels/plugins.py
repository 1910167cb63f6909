"""Kernels from other packages (entry point group ``attnzoo.kernels``): what an entry point loads must be a
:class:`Kernel`, and an error its code raises names the plugin and its entry point, as a mechanism plugin that fails
to load does, rather than surface as a bare traceback from inside attnzoo."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

from attnzoo.attention.kernels.kernel import KERNELS, Kernel


def adopt(loaded: Any, where: str) -> Kernel:
    """The record ``loaded`` with its code wrapped to name ``where`` when it raises; ValueError for anything but a
    :class:`Kernel`."""
    if not isinstance(loaded, Kernel):
        raise ValueError(
            f"{where} is a {type(loaded).__name__}, not an attnzoo.attention.kernels.Kernel: point the entry point "
            "at the kernel's record"
        )
    return dataclasses.replace(
        loaded,
        run=_naming(loaded.run, where, "run"),
        static_reasons=_naming_reasons(loaded.static_reasons, where, "static_reasons"),
        call_reasons=_naming_reasons(loaded.call_reasons, where, "call_reasons"),
        describe=None if loaded.describe is None else _naming(loaded.describe, where, "describe"),
    )


def _naming(fn: Callable[..., Any], where: str, field: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def named(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            raise ValueError(f"{where}: its {field} raised {err!r}") from err

    return named


def _naming_reasons(fn: Callable[..., Iterator[str]], where: str, field: str) -> Callable[..., Iterator[str]]:
    """A reasons function raises where it is iterated (a generator's body runs on ``next``), so the wrapper does."""

    @functools.wraps(fn)
    def named(*args: Any) -> Iterator[str]:
        try:
            yield from fn(*args)
        except Exception as err:
            raise ValueError(f"{where}: its {field} raised {err!r}") from err

    return named


KERNELS.adopt_plugins_with(adopt)
