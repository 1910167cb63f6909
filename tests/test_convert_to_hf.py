"""attnzoo → Hugging Face transformers: every native route loads through ``AutoModelForCausalLM`` without remote
code and computes the same logits and greedy tokens, HF → attnzoo → HF gives every tensor back, and a model no
class holds is refused in one line, with nothing written.

Every parameter is perturbed away from its init (norm weights off 1, biases off 0, λ vectors), so a weight
written to the wrong place, or a head layout permuted wrongly, changes the logits.
"""

import json
import re

import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")

from conftest import TINY_MODEL, tiny_config  # noqa: E402
from training_helpers import TINY_FLAGS, write_text_corpus  # noqa: E402

from attnzoo import ModelConfig, Transformer  # noqa: E402
from attnzoo.cli import main  # noqa: E402
from attnzoo.convert import convert_model, export_hf, from_hf, to_hf  # noqa: E402
from attnzoo.data.tokenizers import ByteTokenizer, CharTokenizer, HFTokenizer  # noqa: E402
from attnzoo.training import load_pretrained  # noqa: E402

VOCAB = TINY_MODEL["vocab_size"]
# fp32 round-off: transformers and attnzoo compute the same model with other kernels and in other orders (a fused
# qkv, SDPA against attnzoo's kernels); the largest difference seen over these cases is under 1e-6.
TOLERANCE = 1e-5
NEOX = dict(norm="layernorm", bias=True, mlp="gelu")
BLOOM = dict(norm="layernorm", bias=True, mlp="gelu_tanh", position="alibi", embedding_norm=True, mlp_hidden_dim=128)
DIFF = dict(attention="diff", attention_options={"subln_affine": False})

# attnzoo config changes → the transformers class that holds them.
ROUTES = {
    "llama": ({}, "LlamaForCausalLM"),
    "llama-gqa-untied-bias": (dict(n_kv_heads=2, tie_embeddings=False, bias=True), "LlamaForCausalLM"),
    "llama-mqa-head-dim": (dict(n_kv_heads=1, head_dim=16), "LlamaForCausalLM"),
    "llama-yarn": (
        dict(position_options={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
        "LlamaForCausalLM",
    ),
    "gpt-neox": (dict(**NEOX, parallel_residual=True, position_options={"partial_rotary_factor": 0.25}), "GPTNeoX"),
    "gpt-neox-sequential-tanh-linear": (
        dict(NEOX, mlp="gelu_tanh", tie_embeddings=False, position_options={"rope_type": "linear", "factor": 2.0}),
        "GPTNeoX",
    ),
    "bloom": (BLOOM, "BloomForCausalLM"),
    "bloom-6-heads-untied": (dict(BLOOM, dim=36, n_heads=6, mlp_hidden_dim=144, tie_embeddings=False), "Bloom"),
    "diffllama": (DIFF, "DiffLlamaForCausalLM"),
    "diffllama-gqa-eps": (
        dict(DIFF, n_kv_heads=2, norm_eps=1e-2, attention_options={"subln_affine": False, "subln_eps": 1e-2}),
        "DiffLlamaForCausalLM",
    ),
}


def perturbed(model, std=0.1):
    """``model`` in eval mode with N(0, std²) added to every parameter."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * std)
    return model.eval()


def attnzoo_model(changes):
    return perturbed(Transformer(tiny_config(max_seq_len=32, **changes)))


def tokens(batch=2, length=12):
    return torch.randint(0, VOCAB, (batch, length))


def max_logit_diff(hf_model, model, ids):
    with torch.no_grad():
        return (hf_model(ids).logits - model(ids)).abs().max().item()


@pytest.fixture(params=list(ROUTES))
def exported(request, tmp_path):
    """(attnzoo model, the class it should become, its export loaded by AutoModelForCausalLM)."""
    changes, hf_class = ROUTES[request.param]
    model = attnzoo_model(changes)
    done = export_hf(model, tmp_path / "hf")
    assert done.files == ("config.json", "generation_config.json", "model.safetensors")
    return model, hf_class, transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()


def test_export_loads_natively_with_the_same_logits(exported):
    model, hf_class, hf_model = exported
    assert type(hf_model).__name__.startswith(hf_class)
    assert type(hf_model).__module__.startswith("transformers.models.")  # no remote code
    assert max_logit_diff(hf_model, model, tokens()) <= TOLERANCE


def test_greedy_generation_matches(exported):
    """HF's cached greedy decoding and attnzoo's emit the same tokens; the export names no EOS that would stop
    HF early, since the model has none."""
    model, _, hf_model = exported
    prompt = tokens(length=5)
    expected = model.generate(prompt, 10, temperature=0.0)
    hf_tokens = hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False)
    assert torch.equal(hf_tokens, expected)


@pytest.mark.parametrize("case", ["llama", "gpt-neox", "bloom", "diffllama-gqa-eps"])
def test_attnzoo_to_hf_and_back_is_the_identity(case):
    model = attnzoo_model(ROUTES[case][0])
    back = from_hf(to_hf(model))
    assert back.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(back.state_dict()[name], t) for name, t in model.state_dict().items())
    # BLOOM has no length limit (ALiBi), so its reader gives BLOOM's training length.
    kept = {"max_seq_len": back.config.max_seq_len} if case == "bloom" else {}
    assert back.config == ModelConfig(**{**model.config.to_dict(), **kept})


def hf_llama(**overrides):
    config = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**config, **overrides}))


def hf_gpt_neox(**overrides):
    config = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**{**config, **overrides}))


def hf_bloom(**overrides):
    config = dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
    return transformers.BloomForCausalLM(transformers.BloomConfig(**{**config, **overrides}))


def hf_diffllama(**overrides):
    config = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=8, intermediate_size=48)
    return transformers.DiffLlamaForCausalLM(transformers.DiffLlamaConfig(**{**config, **overrides}))


HF_MODELS = {
    "llama-gqa-llama3": lambda: hf_llama(
        num_key_value_heads=2,
        rope_parameters={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
        max_position_embeddings=64,
    ),
    "llama-bias-tied-dynamic": lambda: hf_llama(
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0},
    ),
    "gpt-neox": lambda: hf_gpt_neox(),  # Pythia: rotary_pct 0.25, parallel residual, exact GELU
    "gpt-neox-sequential-gelu-new": lambda: hf_gpt_neox(use_parallel_residual=False, hidden_act="gelu_new"),
    "bloom": lambda: hf_bloom(),
    "diffllama-gqa": lambda: hf_diffllama(num_key_value_heads=4, rms_norm_eps=1e-3),
}
# Config entries not carried through attnzoo: the init and dropout (training only), DiffLlama's λ init spread,
# and the special tokens, which live in the tokenizer (test_a_directory_round_trip carries them).
NOT_CARRIED = {
    "initializer_range",
    "attention_dropout",
    "hidden_dropout",
    "classifier_dropout",
    "lambda_std_dev",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
}


@pytest.mark.parametrize("case", HF_MODELS)
def test_hf_to_attnzoo_and_back_is_the_identity(case):
    source = perturbed(HF_MODELS[case]())
    back = to_hf(from_hf(source))
    assert type(back) is type(source)
    assert back.state_dict().keys() == source.state_dict().keys()
    assert all(torch.equal(back.state_dict()[name], t) for name, t in source.state_dict().items())
    config, back_config = source.config.to_dict(), back.config.to_dict()
    assert {k: v for k, v in back_config.items() if k not in NOT_CARRIED} == {
        k: v for k, v in config.items() if k not in NOT_CARRIED
    }


def write_hf_tokenizer(directory, n_bytes=VOCAB - 2):
    """A tiny byte-level BPE with BOS and EOS tokens and the first ``n_bytes`` bytes, as transformers saves one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = [chr(c) for c in sorted(map(ord, pre_tokenizers.ByteLevel.alphabet()))][:n_bytes]
    vocab = {token: i for i, token in enumerate(["<s>", "</s>", *sorted(alphabet)])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(directory)
    return fast


def test_a_directory_round_trip_keeps_weights_config_and_tokenizer(tmp_path):
    """save_pretrained → attnzoo convert → export: the same tensors, config and tokenizer files."""
    source = perturbed(hf_llama(num_key_value_heads=2, bos_token_id=0, eos_token_id=1))
    source.save_pretrained(tmp_path / "hf")
    write_hf_tokenizer(tmp_path / "hf")
    convert_model(tmp_path / "hf", tmp_path / "attnzoo")
    done = export_hf(tmp_path / "attnzoo", tmp_path / "back")
    assert done.hf_class == "LlamaForCausalLM" and done.source == tmp_path / "attnzoo"
    assert "tokenizer.json" in done.tokenizer_files and "tokenizer_config.json" in done.tokenizer_files
    for name in done.tokenizer_files:
        assert (tmp_path / "back" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes()
    weights, back = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert back.keys() == weights.keys() and all(torch.equal(back[name], t) for name, t in weights.items())
    config, back_config = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("hf", "back"))
    assert config == back_config
    generation = json.loads((tmp_path / "back" / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (0, 1)


def test_a_stored_hf_tokenizer_is_written_as_transformers_reads_it(tmp_path):
    """A run stores its tokenizer as attnzoo's record of it; the export writes it as a fast tokenizer."""
    fast = write_hf_tokenizer(tmp_path / "tok")
    definition = json.loads((tmp_path / "tok" / "tokenizer.json").read_text())
    model = attnzoo_model({})
    model.save_pretrained(tmp_path / "model")
    stored = HFTokenizer(definition, VOCAB).to_dict()
    (tmp_path / "model" / "tokenizer.json").write_text(json.dumps(stored))
    done = export_hf(tmp_path / "model", tmp_path / "hf")
    assert done.tokenizer_files == ("tokenizer.json", "tokenizer_config.json")
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "the king sat"
    assert loaded(text).input_ids == fast(text).input_ids == HFTokenizer(definition).encode(text).tolist()


TEXTS = ["the king sat", "  two spaces\n", "héllo ✓ 😀", ""]
ATTNZOO_TOKENIZERS = {"byte": ByteTokenizer(), "char": CharTokenizer.from_texts(TEXTS)}


@pytest.mark.parametrize("kind", ATTNZOO_TOKENIZERS)
def test_a_byte_or_char_tokenizer_is_written_as_a_fast_tokenizer(kind, tmp_path):
    """transformers encodes and decodes as attnzoo's tokenizer does; the byte tokenizer's invalid UTF-8 too."""
    tokenizer = ATTNZOO_TOKENIZERS[kind]
    attnzoo_model(dict(vocab_size=tokenizer.vocab_size)).save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "tokenizer.json").write_text(json.dumps(tokenizer.to_dict()))
    done = export_hf(tmp_path / "model", tmp_path / "hf")
    assert done.tokenizer_files == ("tokenizer.json", "tokenizer_config.json")
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in TEXTS:
        ids = tokenizer.encode(text).tolist()
        assert loaded(text).input_ids == ids and loaded.decode(ids) == text
    # Every id, then ids as sampled, whose bytes need not form UTF-8.
    ids = [*range(tokenizer.vocab_size), *torch.randint(0, tokenizer.vocab_size, (200,)).tolist()]
    assert loaded.decode(ids) == tokenizer.decode(ids)


ATTNZOO_TYPE = "write it as the attnzoo model type instead"
# attnzoo config changes → what the refusal names.
REFUSALS = {
    "dcmha": (dict(attention="dcmha"), "no transformers class computes attention='dcmha'"),
    "selective": (dict(attention="selective"), "attention='selective'"),
    "diff-v2": (dict(attention="diff_v2"), "attention='diff_v2'"),
    "alibi-in-a-llama-layout": (dict(position="alibi"), "LlamaForCausalLM, the closest, cannot hold position='alibi'"),
    "learned": (dict(position="learned"), "position='learned'"),
    "sinusoidal": (dict(position="sinusoidal"), "position='sinusoidal'"),
    "interleaved-rope": (dict(position_options={"interleaved": True}), "position_options.interleaved=True"),
    "gelu-llama": (dict(mlp="gelu"), "mlp='gelu' (it has 'swiglu')"),
    "bidirectional": (dict(causal=False), "causal=False"),
    "gqa-neox": (dict(NEOX, n_kv_heads=2), "GPTNeoXForCausalLM, the closest, cannot hold n_kv_heads=2"),
    "bloom-mlp-width": (dict(BLOOM, mlp_hidden_dim=96), "mlp_hidden_dim=96 (it has 4·dim = 128)"),
    "diff-subln-affine": (dict(attention="diff"), "attention_options.subln_affine=True"),
    "diff-lambda": (
        dict(DIFF, attention_options={"subln_affine": False, "lambda_init": 0.5}),
        "attention_options.lambda_init=0.5",
    ),
    "diff-subln-eps": (
        dict(DIFF, attention_options={"subln_affine": False, "subln_eps": 1e-3}),
        "attention_options.subln_eps=0.001 (it has norm_eps=1e-05)",
    ),
    "diff-bias": (dict(DIFF, bias=True), "DiffLlamaForCausalLM, the closest, cannot hold bias=True"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_model_no_class_holds_is_refused_in_one_line_writing_nothing(case, tmp_path):
    changes, message = REFUSALS[case]
    model = Transformer(tiny_config(max_seq_len=32, **changes))
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        export_hf(model, tmp_path / "hf")
    assert "\n" not in str(refused.value) and ATTNZOO_TYPE in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_the_attnzoo_type_holds_a_model_no_native_class_does(tmp_path):
    hf = pytest.importorskip("attnzoo.hf")
    model = attnzoo_model(dict(attention="dcmha"))
    done = export_hf(model, tmp_path / "hf", hf_type="attnzoo")
    hf.register()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(loaded).__name__ == done.hf_class == "AttnzooForCausalLM"
    assert max_logit_diff(loaded, model, tokens()) <= TOLERANCE


def test_out_must_be_new_or_empty(tmp_path):
    model = attnzoo_model({})
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"held already holds \['notes.txt'\]: name a new or empty directory"):
        export_hf(model, tmp_path / "held")
    assert [p.name for p in (tmp_path / "held").iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ValueError, match="is a file"):
        export_hf(model, tmp_path / "file")
    with pytest.raises(ValueError, match=r"hf_type='gguf' is invalid: choose one of \['native', 'attnzoo'\]"):
        export_hf(model, tmp_path / "new", hf_type="gguf")
    (tmp_path / "empty").mkdir()
    assert export_hf(model, tmp_path / "empty").out == tmp_path / "empty"
    assert (tmp_path / "empty" / "model.safetensors").is_file()


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    """The checkpoint is staged beside OUT: a write that fails half way leaves neither OUT nor the staging."""

    def fail_after_the_config(self, directory, **_):
        self.config.save_pretrained(directory)
        raise OSError("disk full")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", fail_after_the_config)
    with pytest.raises(OSError, match="disk full"):
        export_hf(attnzoo_model({}), tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []


def test_a_trained_run_exports_with_its_tokenizer(tmp_path, capsys):
    """attnzoo train with an HF tokenizer → --to-hf: transformers encodes, scores and decodes as attnzoo does."""
    text, run, out = write_text_corpus(tmp_path / "text.txt"), tmp_path / "run", tmp_path / "hf"
    write_hf_tokenizer(tmp_path / "tokenizer", n_bytes=256)
    train = ["train", "--data", str(text), *TINY_FLAGS, "--tokenizer", f"hf:{tmp_path / 'tokenizer'}"]
    assert main([*train, "--steps", "2", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["convert", "--from", str(run), "--to-hf", str(out)]) == 0
    assert "files: config.json, generation_config.json, model.safetensors, tokenizer.json" in capsys.readouterr().out
    model, checkpoint = load_pretrained(run)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompt = hf_tokenizer("the king", return_tensors="pt").input_ids
    assert prompt[0].tolist() == checkpoint.tokenizer.encode("the king").tolist()
    assert max_logit_diff(hf_model, model, prompt) <= TOLERANCE
    hf_tokens = hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)
    assert torch.equal(hf_tokens, model.generate(prompt, 8, temperature=0.0))
    assert hf_tokenizer.decode(hf_tokens[0]) == checkpoint.tokenizer.decode(hf_tokens[0].tolist())


def test_the_command_line(tmp_path, capsys):
    model = attnzoo_model(dict(n_kv_heads=2))
    model.save_pretrained(tmp_path / "model")
    assert main(["convert", "--from", str(tmp_path / "model"), "--to-hf", str(tmp_path / "hf")]) == 0
    printed = capsys.readouterr().out
    assert f"as LlamaForCausalLM: {model.num_parameters():,} parameters" in printed
    assert "has no tokenizer" in printed and "AutoModelForCausalLM.from_pretrained(" in printed
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert max_logit_diff(loaded, model, tokens()) <= TOLERANCE


BAD_COMMANDS = {
    "from-hf": (["--from-hf", "{dir}", "--to-hf", "{out}"], "--from-hf's already is one"),
    "kv-heads": (["--from", "{dir}", "--to-hf", "{out}", "--kv-heads", "1"], "regroup with --out DIR first"),
    "hf-type-without-to-hf": (["--from", "{dir}", "--out", "{out}", "--hf-type", "attnzoo"], "add --to-hf DIR"),
    "no-native-class": (["--from", "{dir}", "--to-hf", "{out}"], "--hf-type attnzoo"),
}


@pytest.mark.parametrize("case", BAD_COMMANDS)
def test_bad_command_lines_give_one_line_and_write_nothing(case, tmp_path, capsys):
    Transformer(tiny_config(max_seq_len=32, attention="selective")).save_pretrained(tmp_path / "model")
    flags, message = BAD_COMMANDS[case]
    argv = [flag.format(dir=tmp_path / "model", out=tmp_path / "out") for flag in flags]
    assert main(["convert", *argv]) == 1
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error
    assert not (tmp_path / "out").exists()
