"""Hugging Face and official checkpoints ⇄ attnzoo, with the same logits.

``from_hf(model_or_dir)`` turns a transformers causal LM (an object, or a directory written by its
``save_pretrained``, read locally) or an official DCFormer checkpoint directory into an fp32 attnzoo
``Transformer``; ``to_hf(model)`` turns a LLaMA-shaped attnzoo model into ``LlamaForCausalLM``. Whatever a
converter cannot reproduce exactly (a rope type, a sliding window, a bias layout, a leftover weight) raises
``ValueError`` naming it. Dropout settings, which change training only, are not carried over.
``convert_model(source, out)`` (``attnzoo convert``) writes the converted model as an attnzoo model directory,
with a copy of the source's tokenizer files. ``pool_kv_heads(model, G)`` turns a multi-head model into GQA/MQA
by mean-pooling each group's kv heads (Ainslie et al., 2023), and ``group_kv_heads(source, out, G)`` writes one
from an attnzoo run or model directory (``attnzoo convert --from``), the start of GQA uptraining.

transformers is optional (``pip install -e ".[hf]"`` in the checkout, version 5 or later); it is imported only
when needed.
"""

from attnzoo.convert import dcformer
from attnzoo.convert.directory import Conversion, convert_model, group_kv_heads
from attnzoo.convert.hf import CONVERTERS, from_hf
from attnzoo.convert.kv_heads import pool_kv_heads
from attnzoo.convert.llama import to_hf

from_dcformer = dcformer.from_official

__all__ = [
    "CONVERTERS",
    "Conversion",
    "convert_model",
    "from_dcformer",
    "from_hf",
    "group_kv_heads",
    "pool_kv_heads",
    "to_hf",
]
