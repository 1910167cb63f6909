"""The outlier, entropy and spikiness probes: each metric on hand-built inputs with a known value, the model's
records (logits filed by layer, layer outputs), and ``attnzoo eval --task probes``."""

import json
import math

import pytest
import torch
from training_helpers import TINY_FLAGS, write_text_corpus

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import ATTENTION
from attnzoo.cli import main
from attnzoo.evals.probes import (
    LayerProbe,
    activation_outliers,
    length_bucket,
    probe_model,
    probe_tables,
    row_entropy,
    row_spikiness,
    spikiness_by_length,
    top_logit,
)

MECHANISMS = ATTENTION.names()  # plugins included: a mechanism added later is tested, not skipped


def test_activation_outliers_of_a_known_tensor():
    x = torch.tensor([[0.5, -1.0, 2.0], [-40.0, 1.5, -0.25]])
    outliers = activation_outliers(x)
    # |x| sorted: 0.25 0.5 1 1.5 2 40 → the lower middle value is 1.
    assert (outliers.top, outliers.median, outliers.ratio) == (40.0, 1.0, 40.0)
    assert activation_outliers(torch.zeros(3)).ratio == math.inf


def test_top_logit_is_the_largest_magnitude_per_head():
    logits = torch.zeros(2, 3, 4, 4)
    logits[0, 0, 2, 1] = -7.5  # a negative logit counts by its magnitude
    logits[1, 1, 3, 3] = 3.0
    assert top_logit(logits).tolist() == [7.5, 3.0, 0.0]


def test_spikiness_of_one_hot_uniform_and_signed_rows():
    one_hot = torch.tensor([0.0, 1.0, 0.0, 0.0])
    uniform = torch.full((4,), 0.25)
    two = torch.tensor([0.5, 0.5, 0.0, 0.0])
    rows = torch.stack([one_hot, uniform, two])
    assert row_spikiness(rows).tolist() == pytest.approx([1.0, 0.5, 1 / math.sqrt(2)])
    # Scale-free and sign-blind: a differential row (A1 − λA2) is read as |p|.
    assert row_spikiness(torch.tensor([0.3, -0.3, 0.0])).item() == pytest.approx(1 / math.sqrt(2))
    assert row_spikiness(3 * uniform).item() == pytest.approx(0.5)


def test_entropy_of_known_rows():
    rows = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    assert row_entropy(rows).tolist() == pytest.approx([0.0, math.log(4), math.log(2)])
    assert row_entropy(torch.tensor([0.2, -0.2])).item() == pytest.approx(math.log(2))


def test_spikiness_is_averaged_within_power_of_two_length_buckets():
    assert [length_bucket(n) for n in (1, 2, 3, 4, 7, 8, 100)] == ["1", "2-3", "2-3", "4-7", "4-7", "8-15", "64-127"]
    # A causal map uniform over each row's keys: row t has spikiness 1/√(t+1).
    length = 8
    causal = torch.tril(torch.ones(length, length))
    probs = (causal / causal.sum(-1, keepdim=True))[None, None]
    lengths = torch.arange(1, length + 1)
    by_bucket = spikiness_by_length(probs, lengths)
    assert list(by_bucket) == ["1", "2-3", "4-7", "8-15"]
    expected = {
        "1": 1.0,
        "2-3": (2**-0.5 + 3**-0.5) / 2,
        "4-7": sum(n**-0.5 for n in range(4, 8)) / 4,
        "8-15": 8**-0.5,
    }
    assert by_bucket == pytest.approx(expected)


@pytest.mark.parametrize("attention", MECHANISMS)
def test_probe_model_reads_every_layer_of_every_mechanism(attention):
    cfg = ModelConfig(vocab_size=40, dim=32, n_layers=3, n_heads=4, attention=attention, position="alibi")
    model = Transformer(cfg).train()
    tokens = torch.randint(0, 40, (2, 10))
    probes = probe_model(model, tokens)
    assert model.training  # restored
    assert [p.layer for p in probes] == [0, 1, 2]
    maps, logits = model.attention_maps(tokens), {}
    model.attention_maps(tokens, logits=logits)
    assert sorted(logits) == [0, 1, 2]
    # Diff attends twice per layer (A1, A2); every other mechanism once.
    assert {len(calls) for calls in logits.values()} == {2 if attention == "diff" else 1}
    for probe, layer_map in zip(probes, maps, strict=True):
        heads = layer_map.shape[1]
        assert len(probe.entropy_per_head) == heads
        assert 0 <= probe.entropy <= math.log(10) + 1e-5
        assert 10**-0.5 - 1e-6 <= probe.spikiness <= 1 + 1e-6
        assert probe.spikiness_by_length["1"] == pytest.approx(1.0)
        assert probe.hidden_top >= probe.hidden_median > 0
        assert probe.top_logit == max(probe.top_logit_per_head) > 0


def test_probe_records_what_enters_the_softmax_and_the_layer_outputs():
    cfg = ModelConfig(vocab_size=40, dim=32, n_layers=2, n_heads=2, position="none", attn_backend="eager")
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 40, (1, 6))
    outputs = []
    model.layers[1].register_forward_hook(lambda module, args, out: outputs.append(out))
    (probe_0, probe_1) = probe_model(model, tokens)
    assert probe_1.hidden_top == pytest.approx(outputs[0].abs().max().item())
    # Layer 0's logits by hand: q·kᵀ/√d over the causal entries.
    attn = model.layers[0].self_attn
    x = model.layers[0].input_layernorm(model.embed_tokens(tokens))
    q, k, _ = attn._project(x)
    logits = (q @ k.transpose(-2, -1)) / math.sqrt(attn.head_dim)
    visible = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    expected = logits.abs().masked_fill(~visible, 0).amax(dim=(0, 2, 3))
    assert probe_0.top_logit_per_head == pytest.approx(expected.tolist(), rel=1e-5)


def test_spikiness_skips_rows_outside_a_local_window():
    cfg = ModelConfig(
        vocab_size=40,
        dim=32,
        n_layers=2,
        n_heads=2,
        attention="dcmha",
        attention_options={"window_size": 3, "window_type": "LG"},
    )
    probes = probe_model(Transformer(cfg), torch.randint(0, 40, (1, 12)))
    assert list(probes[0].spikiness_by_length) == ["1", "2-3"]  # local: at most 3 keys
    assert list(probes[1].spikiness_by_length) == ["1", "2-3", "4-7", "8-15"]


def test_probe_tables_have_one_row_per_layer_and_fit_a_terminal():
    """One table was ~200 columns wide for a model of 8 heads at 256 tokens."""
    heads, buckets = [2.5 + h / 100 for h in range(8)], {"1": 1.0, "2-3": 0.7, "4-7": 0.5, "8-15": 0.4}
    local = LayerProbe(0, 1.5, [1.5], 2.0, 0.5, 4.0, 0.7, heads, 0.6, {"1": 1.0, "2-3": 0.7})
    wide = LayerProbe(1, 1.5, [1.5], 2.0, 0.5, 4.0, 0.7, heads, 0.6, {**buckets, "16-31": 0.3, "32-63": 0.2,
                      "64-127": 0.15, "128-255": 0.1, "256-511": 0.05})  # fmt: skip
    summary, by_head, by_length = (table.to_text().splitlines() for table in probe_tables([local, wide]))
    assert all(len(lines) == 4 for lines in (summary, by_head, by_length))
    assert max(len(line) for line in (*summary, *by_head, *by_length)) <= 100
    assert by_head[2].split() == ["layer", "0", *(f"{h:.2f}" for h in heads)]
    assert by_length[2].split()[2:] == ["1.00", "0.70", *["—"] * 7]  # the local layer sees no longer context


def test_eval_task_probes_prints_a_table_and_json(tmp_path, capsys):
    text = write_text_corpus(tmp_path / "text.txt")
    run = tmp_path / "run"
    train = ["train", "--data", str(text), "--out", str(run), *TINY_FLAGS, "--steps", "2"]
    assert main([*train, "--attention", "diff"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--task", "probes", "--max-windows", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["windows"] == 2 and len(result["layers"]) == 2
    assert {"top_logit", "hidden_ratio", "entropy_per_head", "spikiness_by_length"} <= set(result["layers"][0])
    assert main(["eval", str(run), "--task", "probes"]) == 0
    out = capsys.readouterr().out
    assert "top logit" in out and "spikiness by context length" in out
