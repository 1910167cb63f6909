"""The ``attnzoo`` transformers model type (``attnzoo.hf``): config, weights, loss, generate, Trainer and LoRA.

Each test builds a tiny attnzoo model and compares what transformers does with it against attnzoo itself: logits
bit for bit (the same module runs), greedy tokens exactly, the loss against an explicit shift.
"""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL, tiny_config, tiny_model
from safetensors.torch import load_file, save_file

from attnzoo import ModelConfig

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("attnzoo.hf")

VOCAB = TINY_MODEL["vocab_size"]
# Every mechanism, and across them every positional scheme, MHA/GQA/MQA and a DCMHA window narrower than the
# generations below, so that its ring cache wraps.
CASES = {
    "mha-alibi-mqa": {"attention": "mha", "position": "alibi", "n_kv_heads": 1},
    "mha-learned": {"attention": "mha", "position": "learned"},
    "selective-rope-gqa": {"attention": "selective", "n_kv_heads": 2},
    "dcmha-rope-window": {"attention": "dcmha", "attention_options": {"window_size": 4}},
    "dcmha-alibi": {"attention": "dcmha", "position": "alibi"},
    "diff-sinusoidal": {"attention": "diff", "position": "sinusoidal"},
    "diff_v2-none-untied": {"attention": "diff_v2", "position": "none", "tie_embeddings": False},
}


def _tokens(batch: int = 2, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", autouse=True)
def registered():
    hf.register()
    hf.register()  # idempotent


def test_the_config_has_every_model_config_field_with_its_default():
    theirs = {field.name: field for field in dataclasses.fields(ModelConfig)}
    ours = {field.name: field for field in dataclasses.fields(hf.AttnzooConfig) if field.name in theirs}
    assert list(ours) == list(theirs)
    for name, field in theirs.items():
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        mine = ours[name].default_factory() if ours[name].default is dataclasses.MISSING else ours[name].default
        assert mine == default, name


@pytest.mark.parametrize("changes", CASES.values(), ids=CASES.keys())
def test_the_config_round_trips_through_config_json(changes, tmp_path):
    config = tiny_config(**changes, norm_eps=1e-6, init_std=0.05)
    hf.AttnzooConfig.from_model_config(config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "attnzoo"
    assert all(saved[name] == value for name, value in config.to_dict().items())  # defaults too: every field
    loaded = transformers.AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, hf.AttnzooConfig) and loaded.to_model_config() == config
    assert (loaded.hidden_size, loaded.num_hidden_layers, loaded.num_key_value_heads) == (32, 2, config.n_kv_heads)
    assert loaded.tie_word_embeddings is config.tie_embeddings


def test_a_bad_config_is_refused_as_model_config_refuses_it():
    with pytest.raises(ValueError) as theirs:
        ModelConfig(dim=30, n_heads=4)
    with pytest.raises(ValueError) as ours:
        hf.AttnzooConfig(dim=30, n_heads=4)
    assert str(ours.value) == str(theirs.value)


def test_from_attnzoo_wraps_the_model_itself():
    model = tiny_model(attention="dcmha")
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(model)
    assert wrapped.to_attnzoo() is model and wrapped.config.to_model_config() == model.config
    tokens = _tokens()
    with torch.no_grad():
        assert torch.equal(wrapped(tokens).logits, model(tokens))
    with pytest.raises(ValueError, match="is not ModelConfig"):
        hf.AttnzooForCausalLM(hf.AttnzooConfig.from_model_config(tiny_config(dim=64)), model)


@pytest.mark.parametrize("changes", CASES.values(), ids=CASES.keys())
def test_save_and_auto_from_pretrained_give_the_same_model(changes, tmp_path):
    model = tiny_model(**changes)
    hf.AttnzooForCausalLM.from_attnzoo(model).save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    expected = {f"model.{name}" for name in model.state_dict()}
    if model.config.tie_embeddings:  # stored once, under the embedding's name
        expected.remove("model.lm_head.weight")
    assert set(stored) == expected
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, hf.AttnzooForCausalLM)
    inner = loaded.to_attnzoo()
    assert (inner.lm_head.weight is inner.embed_tokens.weight) is model.config.tie_embeddings
    tokens = _tokens()
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens))  # buffers (RoPE, sinusoids) recomputed alike


def test_weights_a_checkpoint_lacks_get_attnzoos_init_and_the_rest_load(tmp_path):
    model = tiny_model(attention="selective")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # away from any init
    hf.AttnzooForCausalLM.from_attnzoo(model).save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    missing = {"model.layers.0.self_attn.q_temperature.weight", "model.layers.0.self_attn.q_temperature.alpha"}
    save_file({name: tensor for name, tensor in stored.items() if name not in missing}, tmp_path / "model.safetensors")
    loaded = hf.AttnzooForCausalLM.from_pretrained(tmp_path)
    fresh = tiny_model(attention="selective").state_dict()  # τ's init is deterministic: f's last layer 0, α constant
    state = loaded.state_dict()
    for name, tensor in stored.items():
        assert torch.equal(state[name], fresh[name.removeprefix("model.")] if name in missing else tensor), name


def test_the_loss_shifts_the_labels_as_transformers_does():
    model = tiny_model(attention="selective")
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(model)
    tokens = _tokens()
    labels = tokens.clone()
    labels[0, 3] = -100
    out = wrapped(tokens, labels=labels)
    logits = out.logits.detach()
    expected = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
    assert torch.allclose(out.loss, expected, rtol=1e-6)
    # attnzoo's own loss, whose targets are already the next tokens.
    targets = F.pad(labels[:, 1:], (0, 1), value=-100)
    assert torch.allclose(out.loss, model(tokens, targets)[1], rtol=1e-6)
    out.loss.backward()
    assert model.layers[0].self_attn.q_proj.weight.grad is not None


def test_return_dict_false_gives_the_tuple():
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(tiny_model())
    tokens = _tokens()
    loss, logits = wrapped(tokens, labels=tokens, return_dict=False)
    assert loss.dim() == 0 and logits.shape == (2, 7, VOCAB)


@pytest.mark.parametrize("changes", CASES.values(), ids=CASES.keys())
def test_greedy_generate_gives_attnzoos_tokens_with_and_without_the_cache(changes):
    model = tiny_model(**changes)
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(model)
    prompt = _tokens(length=5)
    cached = wrapped.generate(prompt, max_new_tokens=9, do_sample=False, return_dict_in_generate=True)
    uncached = wrapped.generate(prompt, max_new_tokens=9, do_sample=False, use_cache=False)
    assert torch.equal(cached.sequences, uncached)
    assert torch.equal(cached.sequences, model.generate(prompt, 9, temperature=0))
    cache = cached.cache
    assert isinstance(cache, hf.AttnzooCache) and cache.get_seq_length() == 5 + 9 - 1
    if model.config.attention == "dcmha":  # the key-side composition weights, cached as attnzoo caches them
        assert "kw" in cache.kv.layers[0].buffers


def test_beam_search_and_sampling_agree_with_and_without_the_cache():
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(tiny_model(attention="dcmha", attention_options={"window_size": 4}))
    prompt = _tokens(length=5)
    beams = {use: wrapped.generate(prompt, max_new_tokens=6, num_beams=3, use_cache=use) for use in (True, False)}
    assert torch.equal(beams[True], beams[False])
    samples = {}
    for use in (True, False):
        torch.manual_seed(2)
        samples[use] = wrapped.generate(prompt, max_new_tokens=6, do_sample=True, num_return_sequences=2, use_cache=use)
    assert samples[True].shape == (4, 11) and torch.equal(samples[True], samples[False])


def test_a_cache_continues_a_sequence_by_hand():
    model = tiny_model(attention="dcmha")
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(model)
    tokens = _tokens(length=8)
    cache = hf.AttnzooCache(max_len=8)
    with torch.no_grad():
        first = wrapped(tokens[:, :5], cache=cache, use_cache=True)
        second = wrapped(tokens[:, 5:], cache=first.cache, attention_mask=torch.ones(2, 8, dtype=torch.long))
        full = model(tokens)
    assert cache.get_seq_length() == 8
    assert torch.allclose(torch.cat((first.logits, second.logits), dim=1), full, atol=1e-5)  # other chunking


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attention_mask": torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])}, "masks tokens before real ones"),
        ({"attention_mask": torch.ones(2, 5)}, r"attention_mask must have shape \(2, 4\)"),
        ({"position_ids": torch.tensor([[1, 2, 3, 4]])}, r"position_ids must be 0..3"),
        ({"cache": transformers.DynamicCache()}, "not a DynamicCache"),
        ({"output_attentions": True}, "attention_maps"),
        ({"inputs_embeds": torch.zeros(2, 4, 32)}, "exactly one of input_ids and inputs_embeds"),
        ({"cache": hf.AttnzooCache(max_len=8), "input_ids": torch.zeros(3, 4, dtype=torch.long)}, "batch size 3"),
    ],
    ids=["left-padding", "mask-shape", "positions", "dynamic-cache", "attentions", "both-inputs", "cache-batch"],
)
def test_what_an_attnzoo_model_cannot_do_is_refused_with_the_reason(kwargs, message):
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(tiny_model())
    if "cache" in kwargs and isinstance(kwargs["cache"], hf.AttnzooCache):
        wrapped(torch.zeros(2, 2, dtype=torch.long), cache=kwargs["cache"])  # allocated for 2 sequences
    with pytest.raises(ValueError, match=message):
        wrapped(**{"input_ids": torch.zeros(2, 4, dtype=torch.long), **kwargs})


def test_right_padding_leaves_the_real_tokens_exact_and_a_cache_refuses_any():
    model = tiny_model(attention="dcmha")
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(model)
    tokens = _tokens(length=8)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0  # the second sequence is 5 tokens long
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as transformers derives them
    with torch.no_grad():
        logits = wrapped(tokens, attention_mask=mask, position_ids=position_ids).logits
        # The same math over 8 keys or 5 (3 of them masked): equal up to fp32 summation order.
        torch.testing.assert_close(logits[1, :5], model(tokens[1:, :5])[0], rtol=0, atol=1e-5)
        with pytest.raises(ValueError, match="padding with a cache"):
            wrapped(tokens, attention_mask=mask, cache=hf.AttnzooCache(max_len=8))
    bidirectional = hf.AttnzooForCausalLM.from_attnzoo(tiny_model(causal=False))
    with pytest.raises(ValueError, match="masks tokens before real ones"):  # its real tokens would see the pads
        bidirectional(tokens, attention_mask=mask)


def test_inputs_embeds_run_without_a_cache_and_are_refused_with_one():
    model = tiny_model()
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(model)
    tokens = _tokens()
    with torch.no_grad():
        assert torch.equal(wrapped(inputs_embeds=model.embed_tokens(tokens)).logits, model(tokens))
    with pytest.raises(ValueError, match="inputs_embeds cannot continue a cache"):
        wrapped(inputs_embeds=torch.zeros(2, 4, 32), cache=hf.AttnzooCache(max_len=8))


def test_generate_refuses_a_transformers_cache_implementation():
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(tiny_model())
    with pytest.raises(ValueError, match="cache_implementation='static' is not available"):
        wrapped.generate(_tokens(), max_new_tokens=2, cache_implementation="static")


def _dataset(n: int = 4, length: int = 16) -> list[dict[str, torch.Tensor]]:
    """Rows of ``length`` tokens, the last one right-padded as a collator pads a shorter sequence."""
    rows = []
    for seed in range(n):
        tokens = _tokens(batch=1, length=length, seed=seed)[0]
        mask = torch.ones(length, dtype=torch.long)
        if seed == n - 1:
            mask[length // 2 :] = 0
        rows.append({"input_ids": tokens, "attention_mask": mask, "labels": tokens.masked_fill(mask == 0, -100)})
    return rows


def _train_one_step(model, tmp_path) -> None:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        max_steps=1,
        per_device_train_batch_size=4,  # the whole dataset, its padded row included
        learning_rate=1e-2,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    result = transformers.Trainer(model=model, args=args, train_dataset=_dataset()).train()
    assert result.global_step == 1 and torch.isfinite(torch.tensor(result.training_loss))


def test_one_trainer_step_trains_every_parameter(tmp_path):
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (the dev extra installs it)")
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(tiny_model(attention="dcmha"))
    before = {name: tensor.clone() for name, tensor in wrapped.state_dict().items()}
    _train_one_step(wrapped, tmp_path)
    unchanged = [name for name, tensor in wrapped.state_dict().items() if torch.equal(tensor, before[name])]
    assert not unchanged


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's call
def test_a_lora_adapter_on_q_and_v_trains_and_changes_the_output(tmp_path):
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (the dev extra installs it)")
    peft = pytest.importorskip("peft", reason="LoRA needs peft (the dev extra installs it)")
    wrapped = hf.AttnzooForCausalLM.from_attnzoo(tiny_model(attention="selective"))
    base = {name: tensor.clone() for name, tensor in wrapped.state_dict().items()}
    lora = peft.get_peft_model(
        wrapped, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    trainable = [name for name, parameter in lora.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name and ("q_proj" in name or "v_proj" in name) for name in trainable)
    tokens = _tokens()
    with torch.no_grad():
        start = lora(input_ids=tokens).logits
    assert torch.equal(start, tiny_model(attention="selective")(tokens))  # LoRA's B starts at zero
    _train_one_step(lora, tmp_path)
    with torch.no_grad():
        assert (lora(input_ids=tokens).logits - start).abs().max() > 1e-4
    merged = lora.merge_and_unload()
    assert all(torch.equal(tensor, base[name]) for name, tensor in merged.state_dict().items() if "_proj" not in name)


def test_save_hf_writes_a_directory_auto_loads(tmp_path):
    model = tiny_model(attention="dcmha", vocab_size=256)  # the byte tokenizer's
    model.save_pretrained(tmp_path / "attnzoo")
    (tmp_path / "attnzoo" / "tokenizer.json").write_text('{"kind": "byte"}')
    out = hf.save_hf(tmp_path / "attnzoo", tmp_path / "hf")
    assert json.loads((out / "tokenizer.json").read_text()) == {"kind": "byte"}
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    tokens = _tokens()
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens))
    with pytest.raises(ValueError, match="already exists"):
        hf.save_hf(model, out)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["attnzoo", "hf"]  # nothing left half-written


def test_attnzoo_does_not_import_transformers_and_attnzoo_hf_names_the_extra():
    code = (
        "import sys\n"
        "import attnzoo, attnzoo.model\n"
        "assert 'transformers' not in sys.modules\n"
        "sys.modules['transformers'] = None\n"  # as if it were not installed
        "try:\n"
        "    import attnzoo.hf\n"
        "except ImportError as err:\n"
        "    print(err)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == 'attnzoo.hf needs transformers>=5: pip install -e ".[hf]" in the attnzoo checkout'
