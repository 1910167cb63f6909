"""attnzoo models as first-class transformers models: the ``attnzoo`` model type.

For the mechanisms transformers lacks (DCMHA, selective attention, Diff V2, ALiBi in a Llama-like layout, in fact
any attnzoo configuration), :class:`AttnzooForCausalLM` is a ``PreTrainedModel`` that runs attnzoo's own
``Transformer``, so ``from_pretrained``, ``save_pretrained``, ``generate`` (with attnzoo's cache), ``Trainer`` and
PEFT work on it::

    import attnzoo.hf
    from transformers import AutoModelForCausalLM

    attnzoo.hf.register()                       # AutoConfig / AutoModelForCausalLM learn the "attnzoo" model type
    attnzoo.hf.save_hf("runs/dcmha", "hf/dcmha")  # an attnzoo run, model directory or Transformer → that type
    model = AutoModelForCausalLM.from_pretrained("hf/dcmha")

transformers is optional (``pip install -e ".[hf]"`` in the checkout); ``import attnzoo`` never imports it, and
importing this package without it raises ``ImportError`` naming the extra.
"""

from __future__ import annotations

MIN_TRANSFORMERS_MAJOR = 5  # the generation loop passes `cache`, and configs are dataclasses, from 5.0
HF_EXTRA = 'pip install -e ".[hf]" in the attnzoo checkout'

try:
    import transformers
except ImportError:
    raise ImportError(f"attnzoo.hf needs transformers>={MIN_TRANSFORMERS_MAJOR}: {HF_EXTRA}") from None
if int(transformers.__version__.split(".")[0]) < MIN_TRANSFORMERS_MAJOR:
    raise ImportError(
        f"attnzoo.hf needs transformers>={MIN_TRANSFORMERS_MAJOR}; found {transformers.__version__}: {HF_EXTRA}"
    )

from attnzoo.hf.cache import AttnzooCache  # noqa: E402  (after the check, which names the fix)
from attnzoo.hf.configuration import AttnzooConfig  # noqa: E402
from attnzoo.hf.export import save_hf  # noqa: E402
from attnzoo.hf.modeling import AttnzooForCausalLM  # noqa: E402


def register() -> None:
    """Make ``AutoConfig`` and ``AutoModelForCausalLM`` resolve the ``attnzoo`` model type; calling it again is a
    no-op. Needed before ``Auto*.from_pretrained`` of a directory :func:`save_hf` wrote (the classes themselves
    load without it)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoConfig.register(AttnzooConfig.model_type, AttnzooConfig, exist_ok=True)
    AutoModelForCausalLM.register(AttnzooConfig, AttnzooForCausalLM, exist_ok=True)


__all__ = ["AttnzooCache", "AttnzooConfig", "AttnzooForCausalLM", "register", "save_hf"]
