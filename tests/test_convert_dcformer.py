"""Official DCFormer checkpoints → attnzoo ``dcmha``, checked against a forward written from the official equations.

The state dict is synthetic but in the official layout (Caiyun-AI/DCFormer ``modeling_dcformer.py``): fused
``wqkv`` (all q rows, then k, then v), ``q_norm.scale``, ``dyn_w_proj.{dw1, qkw, dd}`` in slot order
[pre_q, pre_k, post_q, post_k], gpt-fast names elsewhere, and the derived tensors a saved official model
carries. The reference computes in float64, with the official "half" RoPE written interleaved, the
cross-head projection as the official ``_cross_head_proj`` loops it, and masks with finfo.min. Local layers
see ``window_size`` keys including their own, as the JAX training code (see ``attnzoo.convert.dcformer``).
"""

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from attnzoo.convert import from_dcformer, from_hf

CONFIG = {
    "architectures": ["DCFormer"],
    "model_type": "dcformer",
    "dim": 32,
    "n_layer": 3,
    "n_head": 4,
    "n_local_heads": 4,
    "head_dim": 8,
    "intermediate_size": 48,
    "vocab_size": 64,
    "block_size": 64,
    "rope_base": 10000.0,
    "norm_eps": 1e-6,
    "use_qk_norm": True,
    "use_dcmha": True,
    "window_size": 4,
    "window_type": None,
    "query_wise": False,
    "q_chunk_size": 128,
    "is_training": False,
    "torch_dtype": "float32",
}
TOLERANCE = 1e-4


def official_ffn_size(dim):
    """DCFormerConfig's intermediate_size when none is given: find_multiple(int(2 · 4·dim / 3), 256)."""
    n_hidden = int(2 * (4 * dim) / 3)
    return n_hidden if n_hidden % 256 == 0 else n_hidden + 256 - n_hidden % 256


def official_state_dict(config, fused_qkv=True):
    """Random weights with the official names and shapes, scaled so that every part moves the logits."""
    dim, heads, head_dim = config["dim"], config["n_head"], config["dim"] // config["n_head"]
    hidden, vocab = 4 * heads, config["vocab_size"]
    ffn = config["intermediate_size"] or official_ffn_size(dim)
    rank_rows = 2 * (heads // (heads // 2))

    def normal(*shape, std):
        return torch.randn(*shape) * std

    def near_one(size):
        return 1 + normal(size, std=0.1)

    state = {"tok_embeddings.weight": normal(vocab, dim, std=1.0)}
    for i in range(config["n_layer"]):
        p = f"layers.{i}."
        q, k, v = (normal(heads * head_dim, dim, std=dim**-0.5) for _ in range(3))
        if fused_qkv:
            state[p + "attention.wqkv.weight"] = torch.cat((q, k, v))
        else:
            state.update({p + "attention.wq.weight": q, p + "attention.wk.weight": k, p + "attention.wv.weight": v})
        state |= {
            p + "attention.wo.weight": normal(dim, dim, std=dim**-0.5),
            p + "attention.dyn_w_proj.dw1": normal(dim, 1, 4, hidden, std=dim**-0.5),
            p + "attention.dyn_w_proj.qkw": normal(1, 4, hidden, rank_rows, heads, std=0.2),
            p + "attention.dyn_w_proj.dd": normal(dim, 1, 4 * heads, std=dim**-0.5),
            # What the official __init__ leaves behind: merged copies from before loading, identity buffers.
            p + "attention.dyn_w_proj.dw_m": torch.zeros(dim, 4 * hidden + 4 * heads),
            p + "attention.dyn_w_proj.qkw_m": torch.zeros(4, hidden, rank_rows * heads),
            p + "attention.dyn_w_proj.pre_proj.w": torch.eye(heads)[None],
            p + "attention.dyn_w_proj.post_proj.w": torch.eye(heads)[None],
            p + "feed_forward.w1.weight": normal(ffn, dim, std=dim**-0.5),
            p + "feed_forward.w3.weight": normal(ffn, dim, std=dim**-0.5),
            p + "feed_forward.w2.weight": normal(dim, ffn, std=ffn**-0.5),
            p + "attention_norm.weight": near_one(dim),
            p + "ffn_norm.weight": near_one(dim),
        }
        if config["use_qk_norm"]:
            state |= {
                p + "attention.q_norm.scale": near_one(head_dim),
                p + "attention.k_norm.scale": near_one(head_dim),
            }
    state |= {"norm.weight": near_one(dim), "output.weight": normal(vocab, dim, std=dim**-0.5)}
    return state


def rms_norm(x, weight, eps):
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return normed if weight is None else normed * weight


def official_rope(x, base):
    """apply_rotary_emb(mode='half'): pairs (x_i, x_{i+d/2}) rotate by t·base^(−2i/d), written interleaved."""
    head_dim = x.shape[-1]
    freqs = 1.0 / base ** (torch.arange(0, head_dim, 2).double() / head_dim)
    angles = torch.arange(x.shape[1]).double()[:, None] * freqs  # (T, d/2)
    cos, sin = angles.cos()[None, :, None], angles.sin()[None, :, None]
    pairs = x.reshape(*x.shape[:-1], 2, head_dim // 2).transpose(-1, -2)
    first, second = pairs[..., 0], pairs[..., 1]
    return torch.stack((first * cos - second * sin, second * cos + first * sin), dim=-1).flatten(-2)


def cross_head(scores, qw1, qw2, kw1, kw2, qdd, kdd):
    """_cross_head_proj: A + Σ_r qw2·(Σ_n A·qw1) + Σ_r kw2·(Σ_n A·kw1) + A·qdd + A·kdd.

    scores (B, N, T, S); qw (B, T, R, N) from the query token, kw (B, S, R, N) from the key token; dd (B, ·, N).
    """
    out = scores.clone()
    for r in range(qw1.shape[2]):
        query_hidden = torch.einsum("bnts,btn->bts", scores, qw1[:, :, r])
        out = out + torch.einsum("bts,btm->bmts", query_hidden, qw2[:, :, r])
        key_hidden = torch.einsum("bnts,bsn->bts", scores, kw1[:, :, r])
        out = out + torch.einsum("bts,bsm->bmts", key_hidden, kw2[:, :, r])
    return out + scores * qdd.transpose(1, 2)[..., None] + scores * kdd.transpose(1, 2)[:, :, None, :]


def official_windows(config):
    """DCMHAttention.window_size per layer, as the official constructor sets it."""
    patterns = {"LG": [256, None], "LGLL": [256, None, 256, 256], "LGL6": [256, None] + [256] * 6}
    windows = []
    for i in range(config["n_layer"]):
        if config["window_type"] is None:
            windows.append(None if i % 2 == 1 else config["window_size"])
        else:
            pattern = patterns[config["window_type"]]
            windows.append(pattern[i % len(pattern)])
    return windows


@torch.no_grad()
def reference_logits(config, state, ids):
    sd = {name: t.double() for name, t in state.items()}
    if "layers.0.attention.wq.weight" in sd:
        for i in range(config["n_layer"]):
            p = f"layers.{i}.attention."
            sd[p + "wqkv.weight"] = torch.cat([sd[p + name + ".weight"] for name in ("wq", "wk", "wv")])
    dim, heads, eps = config["dim"], config["n_head"], config["norm_eps"]
    head_dim, rank = dim // heads, heads // (heads // 2)
    batch, seq_len = ids.shape
    steps = torch.arange(seq_len)
    distance = steps[:, None] - steps[None, :]
    x = sd["tok_embeddings.weight"][ids]
    for i, window in enumerate(official_windows(config)):
        p = f"layers.{i}."
        h = rms_norm(x, sd[p + "attention_norm.weight"], eps)
        q, k, v = (h @ sd[p + "attention.wqkv.weight"].T).view(batch, seq_len, 3, heads, head_dim).unbind(2)
        if config["use_qk_norm"]:
            q = rms_norm(q, sd[p + "attention.q_norm.scale"], 1e-6)
            k = rms_norm(k, sd[p + "attention.k_norm.scale"], 1e-6)
        q, k = official_rope(q, config["rope_base"]), official_rope(k, config["rope_base"])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))

        hidden = F.gelu(torch.einsum("btd,dgck->btgck", h, sd[p + "attention.dyn_w_proj.dw1"]))
        w = torch.einsum("btgck,gckim->btgcim", hidden, sd[p + "attention.dyn_w_proj.qkw"])[:, :, 0]
        w1, w2 = rms_norm(w[..., :rank, :], None, 1e-6), w[..., rank:, :]  # (B, T, 4 slots, R, N)
        dd = torch.tanh(torch.einsum("btd,dgm->btgm", h, sd[p + "attention.dyn_w_proj.dd"]))[:, :, 0]
        dd = dd.view(batch, seq_len, 4, heads)
        pre = (w1[:, :, 0], w2[:, :, 0], w1[:, :, 1], w2[:, :, 1], dd[:, :, 0], dd[:, :, 1])
        post = (w1[:, :, 2], w2[:, :, 2], w1[:, :, 3], w2[:, :, 3], dd[:, :, 2], dd[:, :, 3])

        logits = cross_head(q @ k.transpose(-2, -1) / math.sqrt(head_dim), *pre)
        allowed = (distance >= 0) & (distance < window if window is not None else True)
        probs = torch.softmax(torch.where(allowed, logits, torch.finfo(logits.dtype).min), dim=-1)
        y = (cross_head(probs, *post) @ v).transpose(1, 2).reshape(batch, seq_len, dim)
        x = x + y @ sd[p + "attention.wo.weight"].T
        h = rms_norm(x, sd[p + "ffn_norm.weight"], eps)
        gate, up = h @ sd[p + "feed_forward.w1.weight"].T, h @ sd[p + "feed_forward.w3.weight"].T
        x = x + (F.silu(gate) * up) @ sd[p + "feed_forward.w2.weight"].T
    return rms_norm(x, sd["norm.weight"], eps) @ sd["output.weight"].T


def tokens(length=12):
    return torch.randint(0, CONFIG["vocab_size"], (2, length))


def max_diff(model, state, config, ids):
    with torch.no_grad():
        return (model.eval()(ids).double() - reference_logits(config, state, ids)).abs().max().item()


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({}, id="local-global"),
        pytest.param({"window_size": None}, id="all-global"),
        pytest.param({"use_qk_norm": False, "n_local_heads": -1, "intermediate_size": None}, id="defaults"),
    ],
)
def test_logits_match_reference(changes):
    config = CONFIG | changes
    state = official_state_dict(config)
    assert max_diff(from_dcformer(config, state), state, config, tokens()) <= TOLERANCE


def test_separate_qkv_weights():
    """wq/wk/wv, the layout the official load hook fuses, convert the same way."""
    state = official_state_dict(CONFIG, fused_qkv=False)
    assert max_diff(from_dcformer(CONFIG, state), state, CONFIG, tokens()) <= TOLERANCE


def test_composition_is_visible():
    """The comparison can fail: the same weights without the dynamic composition give other logits."""
    state = official_state_dict(CONFIG)
    model = from_dcformer(CONFIG, state)
    for layer in model.layers:
        layer.self_attn.dyn_w_proj.qkw.data.zero_()
        layer.self_attn.dyn_w_proj.dd.data.zero_()
    assert max_diff(model, state, CONFIG, tokens()) > 0.1


def test_from_checkpoint_directory(tmp_path):
    state = official_state_dict(CONFIG)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    save_file(state, tmp_path / "model.safetensors")
    assert max_diff(from_hf(tmp_path), state, CONFIG, tokens()) <= TOLERANCE


def test_greedy_generation_matches_reference():
    """Cached decoding (merged key-side matrices, window ring) picks the reference's argmax at every step."""
    state = official_state_dict(CONFIG)
    prompt = tokens(length=5)
    expected = prompt
    for _ in range(8):
        next_token = reference_logits(CONFIG, state, expected)[:, -1].argmax(-1)
        expected = torch.cat((expected, next_token[:, None]), dim=1)
    assert torch.equal(from_dcformer(CONFIG, state).eval().generate(prompt, 8, temperature=0.0), expected)


@pytest.mark.parametrize(
    "changes",
    [{"window_type": "LGLL", "window_size": 256}, {"window_type": "LGL6", "window_size": 256}, {"window_size": 6}],
    ids=["LGLL", "LGL6", "LG"],
)
def test_official_window_patterns(changes):
    config = CONFIG | {"n_layer": 8} | changes
    model = from_dcformer(config, official_state_dict(config))
    assert [layer.self_attn.window for layer in model.layers] == official_windows(config)


CONFIG_REFUSALS = {
    "mgate": ({"mgate": True}, "mgate=True"),
    "no-dcmha": ({"use_dcmha": False}, "use_dcmha=False"),
    "query-wise": ({"query_wise": True}, "query_wise=True"),
    "head-dim": ({"head_dim": 16}, "head_dim=16 disagrees with dim // n_head = 8"),
    "gqa": ({"n_local_heads": 2}, "n_local_heads=2"),
    "one-head": ({"n_head": 1, "n_local_heads": 1, "head_dim": 32}, "n_head=1"),
    "pattern-window": ({"window_type": "LGLL", "window_size": 4}, "window_type='LGLL' with window_size=4"),
    "unknown-pattern": ({"window_type": "LLG", "window_size": 256}, "window_type='LLG'"),
}


@pytest.mark.parametrize("case", CONFIG_REFUSALS)
def test_config_refusals(case):
    changes, message = CONFIG_REFUSALS[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        from_dcformer(CONFIG | changes, official_state_dict(CONFIG))


def test_refuses_a_config_without_a_required_field():
    config = {name: value for name, value in CONFIG.items() if name != "rope_base"}
    with pytest.raises(ValueError, match=re.escape("config lacks ['rope_base']")):
        from_dcformer(config, official_state_dict(CONFIG))


def test_weight_refusals():
    state = official_state_dict(CONFIG)
    with pytest.raises(ValueError, match=r"no attnzoo counterpart.*layers\.0\.attention\.dyn_w_proj\.sw_b"):
        from_dcformer(CONFIG, state | {"layers.0.attention.dyn_w_proj.sw_b": torch.zeros(4, 4)})
    del state["output.weight"]
    with pytest.raises(ValueError, match=re.escape("no 'output.weight'")):
        from_dcformer(CONFIG, state)
