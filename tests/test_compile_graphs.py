"""What ``torch.compile`` captures: a training forward and a static decoding step (``Transformer.decode_step``, what
``generate(compile=True)`` compiles into CUDA graphs) are each one graph, for every mechanism, with a positional bias
(ALiBi) and with rotations (RoPE), under GQA. A graph break splits a compiled model into pieces run between Python,
unfused, and a decode step with a break cannot be captured as one CUDA graph. Traced by dynamo alone
(``torch._dynamo.explain``: nothing is generated, so this is quick); on the CPU, where the kernels a traced call
takes are the PyTorch ones (the fused C++ ops have no fake kernel and refuse a compiling call)."""

import pytest
import torch
import torch._dynamo

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import ATTENTION


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("position", ["rope", "alibi"])
@pytest.mark.parametrize("mechanism", sorted(ATTENTION.names()))
def test_training_and_a_static_decode_step_are_one_graph_each(mechanism, position):
    cfg = ModelConfig(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, attention=mechanism, position=position,
        max_seq_len=32,
    )  # fmt: skip
    model = Transformer(cfg).train()
    idx = torch.randint(0, 64, (2, 24))
    training = torch._dynamo.explain(model)(idx, idx)
    assert training.graph_count == 1, [b.reason for b in training.break_reasons]
    model.eval()
    cache = model.new_cache(2, 32, static=True)
    with torch.no_grad():
        model(idx[:, :8], cache=cache)
        decoding = torch._dynamo.explain(model.decode_step)(idx[:, 8:9], torch.tensor([8]), cache)
    assert decoding.graph_count == 1, [b.reason for b in decoding.break_reasons]
