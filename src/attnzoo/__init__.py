"""attnzoo: modern attention mechanisms for decoder-only Transformers, side by side.

The public names are imported on first use (PEP 562): ``import attnzoo`` alone loads no torch, so the ``attnzoo``
command (:mod:`attnzoo.__main__`) can catch a Ctrl-C while torch is still loading.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnzoo.cache import KVCache, LayerCache
    from attnzoo.config import ModelConfig
    from attnzoo.model import Transformer

__version__ = "0.1.0"

_HOMES = {"KVCache": "attnzoo.cache", "LayerCache": "attnzoo.cache", "ModelConfig": "attnzoo.config",
          "Transformer": "attnzoo.model"}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'attnzoo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = ["KVCache", "LayerCache", "ModelConfig", "Transformer", "__version__"]
