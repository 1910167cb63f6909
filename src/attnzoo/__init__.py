"""attnzoo: modern attention mechanisms for decoder-only Transformers, side by side."""

from attnzoo.cache import KVCache, LayerCache
from attnzoo.config import ModelConfig
from attnzoo.model import Transformer

__version__ = "0.1.0"

__all__ = ["KVCache", "LayerCache", "ModelConfig", "Transformer", "__version__"]
