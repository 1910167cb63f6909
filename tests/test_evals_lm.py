import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnzoo import ModelConfig, Transformer
from attnzoo.evals import IGNORE_INDEX, LMEvalConfig, evaluate_lm, length_extrapolation
from attnzoo.evals.lm import LMScore, window_plan, windows

BYTE = np.ones(256, dtype=np.int64)  # a byte-level tokenizer: every token one byte


def _windows(tokens, cfg):
    starts, overlap = window_plan(len(tokens), cfg)
    return windows(np.asarray(tokens), starts, overlap, cfg.block_len)


class Uniform(nn.Module):
    """Equal logits for every token: cross-entropy ln V at every position."""

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, idx):
        return self.anchor.expand(*idx.shape, self.vocab_size)


class Fibonacci(nn.Module):
    """Certain of x[t+1] = x[t] + x[t-1] mod V once it has seen two tokens, uniform at a window's first one."""

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, idx):
        logits = torch.zeros(*idx.shape, self.vocab_size) + self.anchor
        following = (idx[:, 1:] + idx[:, :-1]) % self.vocab_size
        logits[:, 1:] = 100 * F.one_hot(following, self.vocab_size).float()
        return logits


def fibonacci_stream(n, vocab_size):
    tokens = [1, 1]
    while len(tokens) < n:
        tokens.append((tokens[-1] + tokens[-2]) % vocab_size)
    return torch.tensor(tokens)


@pytest.mark.parametrize("stride", [None, 4, 1])
def test_windows_score_every_token_after_the_first_once(stride):
    tokens = torch.arange(1000, 1042)  # distinct, so each target names the token it scores
    cfg = LMEvalConfig(block_len=8, stride=stride)
    inputs, targets = _windows(tokens, cfg)
    assert inputs.shape == targets.shape and inputs.shape[1] == 8
    scored = targets[targets != IGNORE_INDEX]
    assert scored.tolist() == sorted(set(scored.tolist()))  # each once, in stream order
    assert scored[0] == 1001  # everything but the first token can be predicted
    assert len(tokens) - 1 - len(scored) < (stride or 8)  # only an incomplete last window is left out
    # Inputs are the stream itself and each target is the token after its input.
    assert torch.equal(targets[targets != IGNORE_INDEX] - 1, inputs[targets != IGNORE_INDEX])
    # After the first window, every scored token sees at least block_len - stride tokens of context.
    later = (targets[1:] != IGNORE_INDEX).nonzero()[:, 1]
    assert later.min() >= 8 - (stride or 8)


def test_uniform_byte_predictor_is_eight_bits_per_byte():
    tokens = torch.randint(0, 256, (200,))
    result = evaluate_lm(Uniform(256), tokens, BYTE, LMEvalConfig(block_len=16))
    assert result.loss == pytest.approx(math.log(256))
    assert result.perplexity == pytest.approx(256)
    assert result.bits_per_byte == pytest.approx(8.0)
    assert result.tokens == (200 - 1) // 16 * 16
    assert result.bytes == result.tokens
    # Two bytes per token: the same 8 bits per token cover twice the bytes.
    assert evaluate_lm(Uniform(256), tokens, 2 * BYTE, LMEvalConfig(16)).bits_per_byte == pytest.approx(4.0)


def test_bits_per_byte_divide_by_the_exact_bytes_of_the_scored_tokens():
    # Tokens 0-127 are one byte, 128-255 three: bits/byte is total bits over the bytes actually scored, not the
    # stream's mean bytes per token.
    token_bytes = np.where(np.arange(256) < 128, 1, 3)
    tokens = torch.randint(0, 256, (161,))
    result = evaluate_lm(Uniform(256), tokens, token_bytes, LMEvalConfig(block_len=16))
    scored = tokens[1:161]
    assert result.bytes == int(token_bytes[scored.numpy()].sum())
    assert result.bits_per_byte == pytest.approx(8.0 * result.tokens / result.bytes)


def test_max_windows_spreads_blocks_and_needs_nonoverlapping_windows():
    starts, overlap = window_plan(1001, LMEvalConfig(block_len=10, max_windows=4))
    assert starts.tolist() == [0, 250, 500, 750] and not overlap.any()
    with pytest.raises(ValueError, match="max_windows=4 is invalid"):
        LMEvalConfig(block_len=10, stride=5, max_windows=4)


def test_sliding_window_removes_the_early_token_curse():
    vocab, block = 17, 8
    tokens = fibonacci_stream(8 * block + 1, vocab)
    # Nonoverlapping: the first prediction of each of the 8 blocks is uniform, the other 7 are certain.
    chunks = evaluate_lm(Fibonacci(vocab), tokens, BYTE, LMEvalConfig(block_len=block))
    assert chunks.loss == pytest.approx(math.log(vocab) / block, rel=1e-4)
    # Sliding: only the first window's first prediction lacks context; 64 predictions are scored in all.
    sliding = evaluate_lm(Fibonacci(vocab), tokens, BYTE, LMEvalConfig(block_len=block, stride=2))
    assert sliding.tokens == 8 * block
    assert sliding.loss == pytest.approx(math.log(vocab) / sliding.tokens, rel=1e-4)


def test_stream_shorter_than_a_block_is_refused():
    with pytest.raises(ValueError, match="block_len"):
        evaluate_lm(Uniform(4), torch.zeros(8, dtype=torch.long), BYTE, LMEvalConfig(block_len=8))


def test_extrapolation_reports_lengths_the_model_refuses_as_unavailable():
    model = Transformer(ModelConfig(vocab_size=32, dim=16, n_layers=1, n_heads=2, position="learned", max_seq_len=16))
    tokens = torch.randint(0, 32, (80,))
    points = length_extrapolation(model, tokens, BYTE, LMEvalConfig(block_len=8, batch_size=4), (1, 2, 4, 8))
    assert [p.block_len for p in points] == [8, 16, 32, 64]
    for point in points[:2]:
        assert point.result is not None and point.reason is None
        assert point.result.block_len == point.block_len
    for point in points[2:]:
        assert point.result is None and "max_seq_len=16" in point.reason


def test_extrapolation_runs_every_length_for_rope_and_scales_the_stride():
    model = Transformer(ModelConfig(vocab_size=32, dim=16, n_layers=1, n_heads=2, max_seq_len=8))
    tokens = torch.randint(0, 32, (40,))
    points = length_extrapolation(model, tokens, BYTE, LMEvalConfig(block_len=4, stride=2), (1, 2, 4))
    assert all(p.result is not None for p in points)
    assert [p.result.stride for p in points] == [2, 4, 8]
    # An untrained model is close to uniform at every length.
    assert all(abs(p.result.loss - math.log(32)) < 0.3 for p in points)


def test_training_and_eval_report_the_same_bits_per_byte(tmp_path, capsys):
    """One evaluator: the trainer's last validation and `attnzoo eval` on the same windows agree to 1e-6."""
    from training_helpers import TINY_FLAGS, write_text_corpus

    from attnzoo.cli import main

    text, run = write_text_corpus(tmp_path / "text.txt"), tmp_path / "run"
    flags = ["--data", str(text), "--out", str(run), *TINY_FLAGS, "--steps", "2", "--eval-interval", "2"]
    assert main(["train", *flags]) == 0
    trained = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    capsys.readouterr()
    assert main(["eval", str(run), "--json", "--max-windows", "8"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["tokens"] == trained["val_tokens"]
    assert evaluated["bits_per_byte"] == pytest.approx(trained["val_bits_per_byte"], abs=1e-6)


def test_the_perplexity_of_a_loss_past_floats_range_is_infinite():
    """math.exp of a loss above ~709.8 nats raised OverflowError: math range error."""
    score = LMScore(loss=800.0, tokens=10, bytes=10, block_len=8, stride=8)
    assert score.perplexity == math.inf and score.metrics()["perplexity"] == math.inf
    assert LMScore(loss=709.0, tokens=10, bytes=10, block_len=8, stride=8).perplexity == pytest.approx(math.exp(709))


def test_a_diverged_training_run_ends_with_the_divergence_message_not_an_overflow(tmp_path, capsys):
    """`attnzoo train --lr 10 --eval-interval 2` evaluated a loss of thousands of nats and died in math.exp."""
    from training_helpers import TINY_FLAGS, write_text_corpus

    from attnzoo.cli import main

    text, run = write_text_corpus(tmp_path / "text.txt"), tmp_path / "run"
    flags = ["--data", str(text), "--out", str(run), *TINY_FLAGS, "--lr", "10", "--eval-interval", "2", "--steps", "60"]
    assert main(["train", *flags]) == 1
    err = capsys.readouterr().err
    assert "The run has diverged" in err and "OverflowError" not in err, err


@pytest.mark.cuda
def test_a_cuda_model_is_scored_on_its_own_device_at_every_length():
    """compare's extrapolation passes no env: the windows must follow the model to the GPU (they stayed on the
    CPU until the GPU kit of 2026-11-25 hit it), and the scores equal the CPU model's within fp32 reduction error."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=32, dim=16, n_layers=1, n_heads=2, max_seq_len=8))
    tokens = torch.randint(0, 32, (40,))
    cfg = LMEvalConfig(block_len=4, batch_size=2)
    on_cpu = length_extrapolation(model, tokens, BYTE, cfg, (1, 2, 4))
    on_cuda = length_extrapolation(model.cuda(), tokens, BYTE, cfg, (1, 2, 4))
    for cpu, cuda in zip(on_cpu, on_cuda, strict=True):
        assert cuda.result.tokens == cpu.result.tokens
        assert cuda.result.loss == pytest.approx(cpu.result.loss, rel=1e-5)
