"""Swap the attention of a pretrained model and fine-tune it, from the command line.

A tiny random HF Llama (built from a config, no download) → ``attnzoo convert`` → ``attnzoo train --init-from``
with another mechanism, optionally ``--train-only`` its new parameters. The weights a run starts from are read
off its Trainer just before the first step. Most models here have the byte vocabulary and no tokenizer of their
own; those with one (a small BPE saved beside the model) fine-tune, generate and evaluate with it.
"""

import json
import math
import re
import shutil

import pytest
import torch
from hf_tokenizer_helpers import save_byte_level_tokenizer, save_sentencepiece_tokenizer
from safetensors.torch import load_file
from training_helpers import write_text_corpus

from attnzoo import ModelConfig, Transformer
from attnzoo.cli import main
from attnzoo.cli import train as train_command
from attnzoo.data import HFTokenizer
from attnzoo.training import TrainConfig, Trainer, read_checkpoint

transformers = pytest.importorskip("transformers")

VOCAB, DIM, N_HEADS, N_KV_HEADS, SEQ = 256, 32, 4, 2, 32  # the byte vocabulary, so the run's corpus fits
HEAD_DIM = DIM // N_HEADS
# TINY_FLAGS without its model flags, which would override the pretrained configuration.
RUN_FLAGS = [
    "--seq-len", str(SEQ), "--batch-size", "8", "--warmup-steps", "2", "--eval-windows", "8", "--log-interval", "1",
    "--device", "cpu", "--no-progress",
]  # fmt: skip
SELECTIVE_LINEAR = ["--attention", "selective", "--attention-option", "position_coefficient=linear"]
DCMHA_GLOBAL = ["--attention", "dcmha", "--attention-option", "window_type=G"]


def _save_tiny_llama(directory, vocab_size=VOCAB):
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=DIM,
        num_hidden_layers=2,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV_HEADS,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,  # attention far from uniform, so a temperature or a composition shows in the logits
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """(HF directory, the attnzoo directory `attnzoo convert` wrote from it)."""
    root = tmp_path_factory.mktemp("pretrained")
    _save_tiny_llama(root / "hf")
    assert main(["convert", "--from-hf", str(root / "hf"), "--out", str(root / "converted")]) == 0
    return root / "hf", root / "converted"


@pytest.fixture(scope="module")
def with_tokenizer(tmp_path_factory):
    """(HF directory of a Llama with its own SentencePiece-style tokenizer, the directory converted from it)."""
    root = tmp_path_factory.mktemp("with-tokenizer")
    hf_dir = save_sentencepiece_tokenizer(root / "hf")
    _save_tiny_llama(hf_dir, vocab_size=HFTokenizer.from_file(hf_dir).num_ids)
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(root / "converted")]) == 0
    return hf_dir, root / "converted"


@pytest.fixture
def converted(pretrained):
    return pretrained[1]


@pytest.fixture
def text(tmp_path):
    return write_text_corpus(tmp_path / "text.txt")


@pytest.fixture
def started(monkeypatch):
    """The weights each `attnzoo train` of the test starts from, copied when its training loop begins."""
    states = []

    class RecordingTrainer(Trainer):
        def fit(self):
            states.append({name: tensor.clone() for name, tensor in self.raw_model.state_dict().items()})
            return super().fit()

    monkeypatch.setattr(train_command, "Trainer", RecordingTrainer)
    return states


def _train(text, run_dir, *flags):
    return main(["train", "--data", str(text), "--out", str(run_dir), *RUN_FLAGS, *flags])


def _logits(model_dir_or_run, state=None):
    """Logits of the model saved in a directory, or of the run's configuration with ``state``, on fixed tokens."""
    if state is None:
        model = Transformer.from_pretrained(model_dir_or_run)
    else:
        model = Transformer(ModelConfig.from_json(model_dir_or_run / "config.json"))
        model.load_state_dict(state)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model.eval()(tokens)


def test_convert_writes_a_model_with_the_hf_logits(pretrained):
    hf_dir, converted = pretrained
    hf_model = transformers.LlamaForCausalLM.from_pretrained(hf_dir).eval()
    tokens = torch.randint(0, VOCAB, (2, SEQ))
    with torch.no_grad():
        diff = (hf_model(tokens).logits - Transformer.from_pretrained(converted).eval()(tokens)).abs().max()
    assert diff <= 1e-4  # fp32, as the converter tests


@pytest.mark.parametrize(
    ("flags", "tolerance"),
    [
        # τ = 1 + tanh(0) + 0·log n is exactly 1, so queries and values pass through unchanged.
        (SELECTIVE_LINEAR, 0.0),
        # Identity composition, A' = A; the composed fp32 scores differ from SDPA's only by summation order.
        (DCMHA_GLOBAL, 1e-5),
    ],
    ids=["selective-linear", "dcmha-global"],
)
def test_a_swapped_mechanism_starts_computing_what_the_converted_model_did(
    converted, text, tmp_path, started, capsys, flags, tolerance
):
    run = tmp_path / "run"
    assert _train(text, run, "--init-from", str(converted), *flags, "--steps", "1") == 0
    out = capsys.readouterr().out
    assert f"the model starts computing what {converted} did, the added parameters at identity" in out
    assert json.loads((run / "run.json").read_text())["init_from"]["identity"] is True
    added = {name for name in started[0] if name not in load_file(converted / "model.safetensors")}
    assert added and all(".self_attn." in name for name in added)  # the mechanism's own parameters are new
    assert (_logits(run, started[0]) - _logits(converted)).abs().max() <= tolerance


@pytest.mark.parametrize(
    ("flags", "warning"),
    [
        (["--attention", "selective"], "c = σ(α) > 0 (c starts at 0.0113); position_coefficient='linear' starts"),
        (["--attention", "dcmha", "--attention-option", "window_size=8"], "layer 0: a query sees the last 8 keys"),
    ],
    ids=["selective-sigmoid", "dcmha-local-window"],
)
def test_a_form_that_cannot_start_at_identity_is_reported_and_does_differ(
    converted, text, tmp_path, started, capsys, flags, warning
):
    assert _train(text, tmp_path / "run", "--init-from", str(converted), *flags, "--steps", "1") == 0
    out = capsys.readouterr().out
    assert f"warning: the model may not start computing what {converted} computed" in out and warning in out
    assert json.loads((tmp_path / "run" / "run.json").read_text())["init_from"]["identity"] is False
    # What the warning says is so: the identity comparison above can fail.
    assert (_logits(tmp_path / "run", started[0]) - _logits(converted)).abs().max() > 1e-3


def test_train_only_temperature_changes_only_the_temperatures_and_resumes(converted, text, tmp_path, started, capsys):
    run = tmp_path / "run"
    flags = ["--init-from", str(converted), *SELECTIVE_LINEAR, "--train-only", "temperature", "--steps", "4"]
    assert _train(text, run, *flags, "--checkpoint-interval", "2") == 0
    initial = started[0]
    temperatures = {name for name in initial if "temperature" in name}
    trained = sum(initial[name].numel() for name in temperatures)
    assert f"{trained:,} trained, the rest frozen: train_only ['temperature']" in capsys.readouterr().out
    assert json.loads((run / "run.json").read_text())["trainable_parameters"] == trained

    final_dir = read_checkpoint(run).directory
    final = load_file(final_dir / "model.safetensors")
    assert {name for name, tensor in final.items() if not torch.equal(tensor, initial[name])} == temperatures

    # Resuming restores the optimizer state of the trained parameters only and makes the same updates.
    kept = tmp_path / "final.safetensors"
    shutil.copy(final_dir / "model.safetensors", kept)
    shutil.rmtree(final_dir)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    resumed = load_file(read_checkpoint(run).directory / "model.safetensors")
    assert all(torch.equal(resumed[name], tensor) for name, tensor in load_file(kept).items())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--attention", "diff"],
            r"cannot initialise diff attention from .*: diff does not extend mha .* "
            r"Mechanisms that extend mha: \['dcmha', 'selective'\]",
        ),
        (
            ["--attention", "selective", "--n-kv-heads", "1"],
            rf"layers\.0\.self_attn\.k_proj\.weight is \({N_KV_HEADS * HEAD_DIM}, {DIM}\) there but "
            rf"\({HEAD_DIM}, {DIM}\) here",
        ),
        (["--bias"], r"tensor\(s\) outside its attention layers that .* lacks: \['layers\.0\.mlp\.gate_proj\.bias'"),
        (
            ["--tokenizer", "char"],
            rf"has vocab_size {VOCAB} but this run's char tokenizer has \d+ tokens: .* it has no tokenizer\.json: "
            "if its model has one, name it with --tokenizer hf:PATH",
        ),
        (["--resume", "anything"], "--resume continues a run from its own checkpoint; drop --init-from"),
    ],
    ids=["mha-to-diff", "shapes", "added-outside-attention", "vocabulary", "with-resume"],
)
def test_init_from_refuses_what_does_not_carry_over(converted, text, tmp_path, capsys, flags, message):
    assert _train(text, tmp_path / "run", "--init-from", str(converted), *flags) == 1
    err = capsys.readouterr().err  # after the corpus preparation line, if the corpus was read
    assert err.splitlines()[-1].startswith("attnzoo train: error: ") and "Traceback" not in err, err
    assert re.search(message, err), err


def test_train_only_refuses_a_fragment_that_matches_nothing(text, tmp_path, capsys):
    assert _train(text, tmp_path / "run", "--train-only", "mlp", "tmperature") == 1
    err = capsys.readouterr().err
    assert "train_only=['mlp', 'tmperature'] is invalid: ['tmperature'] match(es) no parameter name" in err
    assert "'layers.*.self_attn.q_proj.weight'" in err  # the names it could have matched
    assert TrainConfig.from_json(TrainConfig(train_only=["mlp"]).to_json()).train_only == ("mlp",)
    with pytest.raises(ValueError, match="train_only='mlp' is invalid"):
        TrainConfig(train_only="mlp")  # a string is not a list of fragments


def test_convert_refuses_with_one_line(pretrained, tmp_path, capsys):
    hf_dir, converted = pretrained
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(converted)]) == 1
    assert "already holds ['config.json', 'model.safetensors']: pick another directory" in capsys.readouterr().err
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    assert main(["convert", "--from-hf", str(gpt2), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("attnzoo convert: error: cannot convert") and err.count("\n") == 1
    assert "architectures ['GPT2LMHeadModel'] have no converter" in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------ the model's own tokenizer


def test_convert_copies_the_tokenizer_beside_the_model(with_tokenizer, tmp_path, capsys):
    hf_dir, converted = with_tokenizer
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (converted / name).read_bytes() == (hf_dir / name).read_bytes()
    tokenizer = read_checkpoint(converted).tokenizer
    assert tokenizer == HFTokenizer.from_file(hf_dir) and tokenizer.vocab_size == len(tokenizer.token_bytes())
    # Without a tokenizer.json in the source, the output says how to name one.
    bare = shutil.copytree(hf_dir, tmp_path / "bare", ignore=shutil.ignore_patterns("tokenizer*"))
    assert main(["convert", "--from-hf", str(bare), "--out", str(tmp_path / "out")]) == 0
    assert f"{bare} has no tokenizer.json, so {tmp_path / 'out'} has no tokenizer" in capsys.readouterr().out
    assert read_checkpoint(tmp_path / "out").tokenizer is None


def test_a_converted_model_fine_tunes_generates_and_evaluates_with_its_own_tokenizer(
    with_tokenizer, text, tmp_path, started, capsys
):
    source = shutil.copytree(with_tokenizer[1], tmp_path / "source")
    run = tmp_path / "run"
    flags = ["--init-from", str(source), *SELECTIVE_LINEAR, "--train-only", "temperature", "--steps", "3"]
    assert _train(text, run, *flags) == 0
    tokenizer = read_checkpoint(source).tokenizer
    out = capsys.readouterr().out
    assert f"(hf tokenizer, vocab {tokenizer.vocab_size})" in out
    assert f"the model starts computing what {source} did, the added parameters at identity" in out
    assert (_logits(run, started[0]) - _logits(source)).abs().max() == 0  # τ = 1 exactly
    assert TrainConfig.from_json((run / "train_config.json").read_text()).data.tokenizer == f"hf:{source}"
    corpus = json.loads((run / "run.json").read_text())["corpus"]
    assert "-hf-" in corpus["cache"] and corpus["dtype"] == "uint16"

    shutil.rmtree(source)  # the run and its checkpoints hold the tokenizer whole
    assert read_checkpoint(run).tokenizer == tokenizer
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0  # already at step 3: loads, has nothing to do
    assert "nothing to do: the run already reached step 3" in capsys.readouterr().out
    assert main(["generate", str(run), "--prompt", "the king", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("the king")
    assert main(["eval", str(run), "--json", "--max-windows", "4", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] == 4 * SEQ and math.isfinite(result["bits_per_byte"])
    assert result["bytes"] > result["tokens"]  # BPE tokens average more than one byte


def test_a_named_tokenizer_must_be_the_models_own(with_tokenizer, text, tmp_path, capsys):
    hf_dir, converted = with_tokenizer
    init = ["--init-from", str(converted), "--steps", "1"]
    assert _train(text, tmp_path / "byte", *init, "--tokenizer", "byte") == 1
    err = capsys.readouterr().err
    assert re.search(r"trained with another tokenizer \(hf, \d+ tokens\) than this run's \(byte, 256 tokens\)", err)
    assert _train(text, tmp_path / "hf", *init, "--tokenizer", f"hf:{hf_dir}") == 0  # the same file, named
    assert _train(text, tmp_path / "run", *init, "--tokenizer", f"hf:{tmp_path / 'nowhere'}") == 1
    assert "nowhere does not exist: name a Hugging Face tokenizer.json" in capsys.readouterr().err


def test_a_model_padded_past_its_tokenizers_ids_keeps_its_vocabulary(tmp_path, text, capsys):
    """Pythia's shape: GPT-NeoX with a byte-level BPE of 300 ids and 320 embedding rows."""
    hf_dir = save_byte_level_tokenizer(tmp_path / "hf", vocab_size=300)
    config = transformers.GPTNeoXConfig(
        vocab_size=320, hidden_size=DIM, num_hidden_layers=2, num_attention_heads=N_HEADS, intermediate_size=64
    )
    transformers.GPTNeoXForCausalLM(config).save_pretrained(hf_dir)
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(tmp_path / "converted")]) == 0
    assert "(300 ids; the model's other 20 embedding rows are padding)" in capsys.readouterr().out
    tokenizer = read_checkpoint(tmp_path / "converted").tokenizer
    assert (tokenizer.num_ids, tokenizer.vocab_size) == (300, 320)
    assert _train(text, tmp_path / "run", "--init-from", str(tmp_path / "converted"), "--steps", "1") == 0
    assert read_checkpoint(tmp_path / "run").tokenizer == tokenizer

    small = transformers.GPTNeoXConfig(**{**config.to_dict(), "vocab_size": 256})
    transformers.GPTNeoXForCausalLM(small).save_pretrained(hf_dir)
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(tmp_path / "small")]) == 1
    assert "produces ids up to 299, past the model's vocab_size 256" in capsys.readouterr().err
    assert not (tmp_path / "small").exists()
