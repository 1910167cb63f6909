import torch

from attnzoo import ModelConfig, Transformer


def test_forward_shapes_and_loss():
    cfg = ModelConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4, max_seq_len=16)
    model = Transformer(cfg)
    idx, targets = torch.randint(0, 40, (2, 16)), torch.randint(0, 40, (2, 16))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 16, 40)
    # An untrained model with small init predicts close to uniform: loss ≈ ln(vocab).
    assert abs(loss.item() - torch.log(torch.tensor(40.0)).item()) < 0.2
