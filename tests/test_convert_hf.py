"""HF transformers ⇄ attnzoo: tiny random-weight HF models, built from configs, convert with equal logits.

Every parameter is perturbed away from its HF init (norm weights off 1, biases off 0, λ vectors), so a weight
loaded into the wrong place, or a layout permuted wrongly, changes the logits.
"""

import re

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

from attnzoo import ModelConfig, Transformer  # noqa: E402
from attnzoo.convert import from_hf, to_hf  # noqa: E402

VOCAB, SEQ = 64, 10
TOLERANCE = 1e-4
SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)


def perturbed(model, std=0.1):
    """``model`` in eval mode with N(0, std²) added to every parameter."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * std)
    return model.eval()


def llama(**overrides):
    config = {**SMALL, "intermediate_size": 48, "initializer_range": 0.2, **overrides}
    return perturbed(transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)))


def mistral(**overrides):
    config = {**SMALL, "intermediate_size": 48, "num_key_value_heads": 2, "initializer_range": 0.2, **overrides}
    return perturbed(transformers.MistralForCausalLM(transformers.MistralConfig(**config)))


def gpt_neox(**overrides):
    config = {**SMALL, "intermediate_size": 48, "initializer_range": 0.2, **overrides}
    return perturbed(transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**config)))


def bloom(**overrides):
    config = {"vocab_size": VOCAB, "hidden_size": 32, "n_layer": 2, "n_head": 4, "initializer_range": 0.2, **overrides}
    return perturbed(transformers.BloomForCausalLM(transformers.BloomConfig(**config)))


def diffllama(**overrides):
    config = {**SMALL, "num_hidden_layers": 3, "intermediate_size": 48, "initializer_range": 0.2, **overrides}
    return perturbed(transformers.DiffLlamaForCausalLM(transformers.DiffLlamaConfig(**config)))


def tokens(batch=2, length=SEQ):
    return torch.randint(0, VOCAB, (batch, length))


def max_logit_diff(hf_model, model, ids):
    with torch.no_grad():
        return (hf_model(ids).logits - model.eval()(ids)).abs().max().item()


CASES = {
    "llama": lambda: llama(),
    "llama-gqa": lambda: llama(num_key_value_heads=2),
    "llama-mqa": lambda: llama(num_key_value_heads=1),
    "llama-tied": lambda: llama(tie_word_embeddings=True),
    "llama-head-dim": lambda: llama(head_dim=16),
    "llama-bias": lambda: llama(attention_bias=True, mlp_bias=True),
    "llama-theta": lambda: llama(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "llama-linear": lambda: llama(rope_parameters={"rope_type": "linear", "factor": 2.0}),
    "llama-legacy-rope-scaling": lambda: llama(rope_scaling={"type": "linear", "factor": 3.0}),
    # SEQ > max_position_embeddings, so the dynamic NTK base grows within the forward.
    "llama-dynamic": lambda: llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=6),
    "llama-yarn": lambda: llama(
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
        max_position_embeddings=32,
    ),
    "llama-yarn-mscale": lambda: llama(
        rope_parameters={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 8,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
            "beta_fast": 8.0,
            "truncate": False,
        },
        max_position_embeddings=32,
    ),
    "llama-llama3": lambda: llama(
        rope_parameters={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
        max_position_embeddings=64,
    ),
    "mistral-no-window": lambda: mistral(sliding_window=None),
    "gpt-neox": lambda: gpt_neox(),  # Pythia: rotary_pct 0.25, parallel residual
    "gpt-neox-sequential": lambda: gpt_neox(use_parallel_residual=False),
    "gpt-neox-full-rotary-gelu-new": lambda: gpt_neox(rotary_pct=1.0, hidden_act="gelu_new"),
    "gpt-neox-tied-linear": lambda: gpt_neox(
        tie_word_embeddings=True, rope_scaling={"rope_type": "linear", "factor": 2.0}
    ),
    "bloom": lambda: bloom(),
    "bloom-6-heads": lambda: bloom(hidden_size=36, n_head=6),  # non-power-of-two ALiBi slopes
    "bloom-untied": lambda: bloom(tie_word_embeddings=False),
    "diffllama": lambda: diffllama(),
    "diffllama-gqa": lambda: diffllama(num_attention_heads=8, num_key_value_heads=4),
    "diffllama-head-dim-tied": lambda: diffllama(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
    "diffllama-eps": lambda: diffllama(rms_norm_eps=1e-2),  # a large eps, so a wrong subln eps shows
}


@pytest.mark.parametrize("case", CASES)
def test_logits_match(case):
    hf_model = CASES[case]()
    assert max_logit_diff(hf_model, from_hf(hf_model), tokens()) <= TOLERANCE


def test_perturbation_is_visible():
    """The logits test can fail: DiffLlama query rows left in HF's head order give a different model."""
    hf_model = diffllama(num_attention_heads=8, num_key_value_heads=4)
    model = from_hf(hf_model)
    for i, layer in enumerate(hf_model.model.layers):
        model.layers[i].self_attn.q_proj.weight.data.copy_(layer.self_attn.q_proj.weight)
    assert max_logit_diff(hf_model, model, tokens()) > 0.1


@pytest.mark.parametrize("case", ["llama-gqa", "gpt-neox", "bloom", "diffllama-gqa"])
def test_from_saved_directory(case, tmp_path):
    hf_model = CASES[case]()
    hf_model.save_pretrained(tmp_path)
    assert max_logit_diff(hf_model, from_hf(tmp_path), tokens()) <= TOLERANCE


@pytest.mark.parametrize(
    "case", ["llama-gqa", "llama-dynamic", "mistral-no-window", "gpt-neox", "bloom-6-heads", "diffllama-gqa"]
)
def test_greedy_generation_matches(case):
    """HF's cached greedy decoding and attnzoo's emit the same tokens (llama-dynamic runs past its base length)."""
    hf_model = CASES[case]()
    prompt = tokens(length=5)
    expected = hf_model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False, eos_token_id=None
    )
    assert torch.equal(from_hf(hf_model).eval().generate(prompt, 8, temperature=0.0), expected)


TO_HF_CASES = {
    "default": {},
    "gqa-untied-bias": dict(n_kv_heads=2, tie_embeddings=False, bias=True),
    "head-dim": dict(head_dim=16),
    "linear": dict(position_options={"rope_type": "linear", "factor": 2.0}),
    "dynamic": dict(position_options={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 6}),
    "yarn": dict(position_options={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
    "llama3": dict(position_options={"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8}),
}


@pytest.mark.parametrize("case", TO_HF_CASES)
def test_to_hf_round_trip(case):
    cfg = ModelConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, max_seq_len=32, **TO_HF_CASES[case])
    model = perturbed(Transformer(cfg))
    hf_model = to_hf(model).eval()
    ids = tokens(length=12)
    assert max_logit_diff(hf_model, model, ids) <= TOLERANCE
    back = from_hf(hf_model)
    assert back.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(back.state_dict()[name], t) for name, t in model.state_dict().items())
    assert max_logit_diff(hf_model, back, ids) <= TOLERANCE


REFUSALS = {
    "longrope": (
        lambda: llama(
            rope_parameters={
                "rope_type": "longrope",
                "short_factor": [1.0] * 4,
                "long_factor": [2.0] * 4,
                "original_max_position_embeddings": 16,
            },
            max_position_embeddings=64,
        ),
        "rope_type='longrope'",
    ),
    "unused-rope-key": (
        lambda: llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}),
        "['low_freq_factor']",
    ),
    "llama-partial-rotary": (
        lambda: llama(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
        "partial_rotary_factor=0.5",
    ),
    "attention-bias-without-mlp-bias": (lambda: llama(attention_bias=True), "attention_bias=True with mlp_bias=False"),
    "geglu": (lambda: llama(hidden_act="gelu"), "hidden_act='gelu'"),
    "sliding-window": (lambda: mistral(sliding_window=4), "sliding_window=4"),
    "gpt-neox-no-attention-bias": (lambda: gpt_neox(attention_bias=False), "attention_bias=False"),
    "gpt-neox-relu": (lambda: gpt_neox(hidden_act="relu"), "hidden_act='relu'"),
    "bloom-post-norm-residual": (
        lambda: bloom(apply_residual_connection_post_layernorm=True),
        "apply_residual_connection_post_layernorm=True",
    ),
    "diffllama-bias": (lambda: diffllama(attention_bias=True), "attention_bias=True"),
    "unknown-class": (
        lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4)),
        "GPT2LMHeadModel: no converter",
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refusals(case):
    build, message = REFUSALS[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        from_hf(build())


def test_refuses_a_disagreeing_legacy_rope_type():
    hf_model = llama(rope_parameters={"rope_type": "linear", "factor": 2.0})
    hf_model.config.rope_parameters["type"] = "dynamic"
    with pytest.raises(ValueError, match=re.escape("rope_parameters.type='dynamic' disagrees with rope_type='linear'")):
        from_hf(hf_model)


def test_refuses_weights_it_would_drop():
    hf_model = llama()
    hf_model.model.layers[0].self_attn.q_norm = torch.nn.LayerNorm(8)  # a part attnzoo's mha does not have
    with pytest.raises(ValueError, match=r"no attnzoo counterpart.*self_attn\.q_norm\.bias"):
        from_hf(hf_model)


def test_refuses_transformers_4(monkeypatch):
    hf_model = llama()
    monkeypatch.setattr("transformers.__version__", "4.46.3")  # the module in sys.modules, which attnzoo imports
    with pytest.raises(ImportError, match="transformers>=5"):
        from_hf(hf_model)


def test_directory_refusals(tmp_path):
    with pytest.raises(FileNotFoundError, match="config"):
        from_hf(tmp_path)
    base = transformers.LlamaModel(transformers.LlamaConfig(**SMALL, intermediate_size=48))
    base.save_pretrained(tmp_path / "base")  # no lm_head: AutoModelForCausalLM would initialise one at random
    with pytest.raises(ValueError, match=r"architectures \['LlamaModel'\]"):
        from_hf(tmp_path / "base")


def test_refuses_a_directory_missing_weights(tmp_path):
    """HF would initialise the missing lm_head at random; the converter refuses instead."""
    llama().save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lack or mismatch \['lm_head.weight'\]"):
        from_hf(tmp_path)


TO_HF_REFUSALS = {
    "attention": (dict(attention="dcmha"), "attention='dcmha'"),
    "position": (dict(position="alibi"), "position='alibi'"),
    "interleaved": (dict(position_options={"interleaved": True}), "interleaved=True"),
    "partial-rotary": (dict(position_options={"partial_rotary_factor": 0.5}), "partial_rotary_factor=0.5"),
    "norm": (dict(norm="layernorm"), "norm='layernorm'"),
    "mlp": (dict(mlp="gelu"), "mlp='gelu'"),
    "parallel-residual": (dict(parallel_residual=True), "parallel_residual=True"),
    "embedding-norm": (dict(embedding_norm=True), "embedding_norm=True"),
    "scale-embeddings": (dict(scale_embeddings=True), "scale_embeddings=True"),
}


@pytest.mark.parametrize("case", TO_HF_REFUSALS)
def test_to_hf_refusals(case):
    changes, message = TO_HF_REFUSALS[case]
    model = Transformer(ModelConfig(vocab_size=VOCAB, dim=32, n_layers=1, n_heads=4, **changes))
    with pytest.raises(ValueError, match=re.escape(message)):
        to_hf(model)
