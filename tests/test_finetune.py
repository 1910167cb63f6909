"""Swap the attention of a pretrained model and fine-tune it, from the command line.

A tiny random HF Llama (built from a config, no download) → ``attnzoo convert`` → ``attnzoo train --init-from``
with another mechanism, optionally ``--train-only`` its new parameters. The weights a run starts from are read
off its Trainer just before the first step.
"""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file
from training_helpers import write_text_corpus

from attnzoo import ModelConfig, Transformer, cli
from attnzoo.cli import main
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


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNZOO_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """(HF directory, the attnzoo directory `attnzoo convert` wrote from it)."""
    root = tmp_path_factory.mktemp("pretrained")
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        num_hidden_layers=2,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV_HEADS,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,  # attention far from uniform, so a temperature or a composition shows in the logits
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(root / "hf")
    assert main(["convert", "--from-hf", str(root / "hf"), "--out", str(root / "converted")]) == 0
    return root / "hf", root / "converted"


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

    monkeypatch.setattr(cli, "Trainer", RecordingTrainer)
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
        (["--tokenizer", "char"], rf"has vocab_size {VOCAB} but this run's char tokenizer has \d+ tokens"),
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
