"""Hugging Face and official checkpoints ⇄ attnzoo, with the same logits.

``from_hf(model_or_dir)`` turns a transformers causal LM (an object, or a directory written by its
``save_pretrained``, read locally) or an official DCFormer checkpoint directory into an fp32 attnzoo
``Transformer``; ``to_hf(model)`` turns an attnzoo model into the transformers class that holds its layout
(LLaMA, GPT-NeoX, BLOOM, DiffLlama), the inverse of the reader, and ``export_hf(run_or_model, out)``
(``attnzoo convert --from RUN --to-hf OUT``) writes it as a checkpoint ``AutoModelForCausalLM`` loads without
remote code. Whatever a converter cannot reproduce exactly (a rope type, a sliding window, a bias layout, a
leftover weight, a mechanism transformers lacks) raises ``ValueError`` naming it. Dropout settings, which change
training only, are not carried over.
``convert_model(source, out)`` (``attnzoo convert``) writes the converted model as an attnzoo model directory,
with a copy of the source's tokenizer files. ``pool_kv_heads(model, G)`` turns a multi-head model into GQA/MQA
by mean-pooling each group's kv heads (Ainslie et al., 2023), and ``group_kv_heads(source, out, G)`` writes one
from an attnzoo run or model directory (``attnzoo convert --from``), the start of GQA uptraining.

transformers is optional (``pip install -e ".[hf]"`` in the checkout, version 5 or later); it is imported only
when needed.
"""

from attnzoo.convert import dcformer
from attnzoo.convert.directory import Conversion, convert_model, group_kv_heads
from attnzoo.convert.export import HFExport, export_hf, to_hf
from attnzoo.convert.hf import CONVERTERS, from_hf
from attnzoo.convert.kv_heads import pool_kv_heads

from_dcformer = dcformer.from_official

__all__ = [
    "CONVERTERS",
    "Conversion",
    "HFExport",
    "convert_model",
    "export_hf",
    "from_dcformer",
    "from_hf",
    "group_kv_heads",
    "pool_kv_heads",
    "to_hf",
]
