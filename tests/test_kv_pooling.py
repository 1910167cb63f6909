"""MHA → GQA/MQA conversion by mean-pooling kv heads (Ainslie et al., 2023): the pooled weights, the identity,
the refusals, the converted model's cache, and ``attnzoo convert --from … --kv-heads`` followed by uptraining."""

import json

import pytest
import torch
from conftest import tiny_config
from training_helpers import TINY_FLAGS, write_text_corpus

from attnzoo import Transformer
from attnzoo.attention import ATTENTION
from attnzoo.attention.base import mean_pool_heads
from attnzoo.cli import main
from attnzoo.convert import pool_kv_heads
from attnzoo.training import read_checkpoint

MECHANISMS = ATTENTION.names()  # plugins included: a mechanism added later is tested, not skipped
POOLED_OPTIONS = {
    "selective": {"per_head_coefficient": True, "temperature_fn": "shared"},
    "dcmha": {"window_type": "LG", "window_size": 4},
}


def model_of(attention="mha", **changes):
    changes.setdefault("attention_options", POOLED_OPTIONS.get(attention, {}))
    model = Transformer(tiny_config(vocab_size=50, attention=attention, **changes)).eval()
    with torch.no_grad():  # trained-looking mechanism parameters, so that pooling them is visible
        for name, param in model.named_parameters():
            if "temperature" in name or "dyn_w_proj" in name:
                param.normal_(0, 0.1)
    return model


def test_mean_pool_heads_averages_runs_of_consecutive_heads():
    heads = torch.arange(6 * 2 * 3, dtype=torch.float32).reshape(6 * 2, 3)  # 6 heads of 2 rows
    pooled = mean_pool_heads(heads, 6, 2)
    assert pooled.shape == (2 * 2, 3)
    assert torch.equal(pooled[:2], heads[:6].reshape(3, 2, 3).mean(0))
    assert torch.equal(pooled[2:], heads[6:].reshape(3, 2, 3).mean(0))
    bias = torch.arange(6.0 * 2)
    assert mean_pool_heads(bias, 6, 1).tolist() == [(0 + 2 + 4 + 6 + 8 + 10) / 6, (1 + 3 + 5 + 7 + 9 + 11) / 6]


def test_pooled_weights_and_biases_equal_the_group_means():
    model = model_of(bias=True)
    for param in model.parameters():
        torch.nn.init.normal_(param)
    grouped = pool_kv_heads(model, 2)
    assert grouped.config.n_kv_heads == 2
    d = model.config.head_dim
    for source, target in zip(model.layers, grouped.layers, strict=True):
        for proj in ("k_proj", "v_proj"):
            old, new = getattr(source.self_attn, proj), getattr(target.self_attn, proj)
            for group in range(2):  # kv head g is the mean of source heads 2g and 2g + 1
                heads = [old.weight[h * d : (h + 1) * d] for h in (2 * group, 2 * group + 1)]
                assert torch.allclose(new.weight[group * d : (group + 1) * d], (heads[0] + heads[1]) / 2)
                biases = [old.bias[h * d : (h + 1) * d] for h in (2 * group, 2 * group + 1)]
                assert torch.allclose(new.bias[group * d : (group + 1) * d], (biases[0] + biases[1]) / 2)
        # Everything else is the source's.
        assert torch.equal(source.self_attn.q_proj.weight, target.self_attn.q_proj.weight)
        assert torch.equal(source.self_attn.o_proj.bias, target.self_attn.o_proj.bias)
        assert torch.equal(source.mlp.up_proj.weight, target.mlp.up_proj.weight)


def test_diff_pools_whole_kv_heads_so_striped_sub_heads_stay_apart():
    model = model_of("diff", n_heads=4, head_dim=8)  # sub-heads of d = 4; kv head j owns rows [8j, 8j + 8)
    grouped = pool_kv_heads(model, 1)
    old, new = model.layers[0].self_attn.k_proj.weight, grouped.layers[0].self_attn.k_proj.weight
    assert new.shape == (8, 32)
    # A1's key sub-head (rows 0..3) pools the A1 sub-heads of the 4 kv heads, A2's (rows 4..7) the A2 ones.
    assert torch.allclose(new[:4], torch.stack([old[8 * j : 8 * j + 4] for j in range(4)]).mean(0))
    assert torch.allclose(new[4:], torch.stack([old[8 * j + 4 : 8 * j + 8] for j in range(4)]).mean(0))


def test_selective_pools_its_per_kv_head_value_temperature():
    model = model_of("selective")
    grouped = pool_kv_heads(model, 2)
    old, new = model.layers[1].self_attn.v_temperature, grouped.layers[1].self_attn.v_temperature
    assert torch.allclose(new.weight, old.weight.view(2, 2, -1).mean(1))
    assert torch.allclose(new.alpha, old.alpha.view(2, 2).mean(1))
    # The query side belongs to the query heads: unchanged.
    assert torch.equal(model.layers[1].self_attn.q_temperature.weight, grouped.layers[1].self_attn.q_temperature.weight)


@pytest.mark.parametrize("position", ["rope", "alibi"])
@pytest.mark.parametrize("attention", MECHANISMS)
def test_kv_heads_equal_to_the_source_is_the_identity(attention, position):
    model = model_of(attention, position=position)
    same = pool_kv_heads(model, model.config.n_kv_heads)
    idx = torch.randint(0, 50, (2, 9))
    assert torch.equal(same(idx), model(idx))


@pytest.mark.parametrize("attention", MECHANISMS)
def test_heads_identical_within_groups_pool_without_loss(attention):
    """Where a group's kv heads are already equal, GQA computes exactly what MHA did: this pins the grouping to
    the one the kernels read (query head h reads kv head h // (H / G))."""
    model = model_of(attention, n_heads=4, position="alibi")
    rows = model.layers[0].self_attn.k_proj.weight.shape[0] // 4
    with torch.no_grad():
        for block in model.layers:
            for proj in (block.self_attn.k_proj, block.self_attn.v_proj):
                heads = proj.weight.view(4, rows, -1)
                heads[1], heads[3] = heads[0], heads[2]
            temperature = getattr(block.self_attn, "v_temperature", None)
            if temperature is not None:
                for tensor in (temperature.weight, temperature.alpha):
                    tensor[1], tensor[3] = tensor[0].clone(), tensor[2].clone()
    idx = torch.randint(0, 50, (2, 9))
    assert torch.allclose(pool_kv_heads(model, 2)(idx), model(idx), atol=1e-5)


@pytest.mark.parametrize("kv_heads", [3, 0, 8, 2.0, "2"])
def test_kv_heads_that_do_not_divide_are_refused(kv_heads):
    with pytest.raises(ValueError, match=r"must be an integer that divides n_heads=4"):
        pool_kv_heads(model_of(), kv_heads)
    with pytest.raises(ValueError, match=r"divides the source's n_kv_heads=2"):
        pool_kv_heads(model_of(n_kv_heads=2), 4 if kv_heads == 3 else kv_heads)


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("attention", MECHANISMS)
def test_the_converted_models_cache_equals_its_full_forward(attention, kv_heads):
    grouped = pool_kv_heads(model_of(attention, position="rope"), kv_heads)
    assert grouped.config.n_kv_heads == kv_heads
    idx = torch.randint(0, 50, (2, 11))
    full = grouped(idx)
    cache = grouped.new_cache(2, 11)
    steps = [grouped(idx[:, :6], cache=cache)] + [grouped(idx[:, t : t + 1], cache=cache) for t in range(6, 11)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_convert_from_a_run_then_uptrain(tmp_path, capsys):
    text = write_text_corpus(tmp_path / "text.txt")
    run, out = tmp_path / "mha", tmp_path / "mqa"
    common = ["--data", str(text), *TINY_FLAGS]
    assert main(["train", *common, "--out", str(run), "--steps", "2", "--n-heads", "4"]) == 0
    capsys.readouterr()
    assert main(["convert", "--from", str(run), "--out", str(out), "--kv-heads", "1"]) == 0
    printed = capsys.readouterr().out
    assert "4 heads (1 kv), each kv head the mean of 4 of the source's 4" in printed
    assert "train --init-from" in printed
    assert read_checkpoint(out).model_config.n_kv_heads == 1 and (out / "tokenizer.json").is_file()
    uptrained = tmp_path / "uptrained"
    model_flags = {"--dim", "--n-layers", "--n-heads"}
    train_flags = [f for i, f in enumerate(TINY_FLAGS) if f not in model_flags and TINY_FLAGS[i - 1] not in model_flags]
    uptrain = ["train", "--data", str(text), *train_flags, "--init-from", str(out), "--out", str(uptrained)]
    assert main([*uptrain, "--steps", "2"]) == 0
    config = json.loads((uptrained / "config.json").read_text())
    assert (config["n_heads"], config["n_kv_heads"]) == (4, 1)
    capsys.readouterr()
    assert main(["convert", "--from", str(run), "--out", str(tmp_path / "x"), "--kv-heads", "3"]) == 1
    assert "kv_heads=3 is invalid: must be an integer that divides n_heads=4" in capsys.readouterr().err
    assert main(["convert", "--from", str(run), "--out", str(tmp_path / "y")]) == 1
    assert "name the kv heads with --kv-heads G" in capsys.readouterr().err
    assert main(["convert", "--from", str(run), "--out", str(out), "--kv-heads", "1"]) == 1
    assert "already holds" in capsys.readouterr().err
