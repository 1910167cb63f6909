"""A mechanism swapped into a pretrained transformers model, end to end (docs/jobs/huggingface.md).

A tiny random HF Llama (built from a config, no download) → ``attnzoo convert --from-hf`` → ``attnzoo train
--init-from`` with selective attention or DCMHA started at identity → a few steps → ``attnzoo.hf.save_hf`` → back in
transformers as the ``attnzoo`` model type, loaded by ``AutoModelForCausalLM``.
"""

import pytest
import torch
from training_helpers import write_text_corpus

from attnzoo.cli import main
from attnzoo.cli import train as train_command
from attnzoo.training import Trainer, load_pretrained

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("attnzoo.hf")

pytestmark = pytest.mark.slow

VOCAB, SEQ = 256, 32  # the byte vocabulary, so the run's corpus fits
RUN_FLAGS = [
    "--seq-len", str(SEQ), "--batch-size", "8", "--warmup-steps", "2", "--eval-windows", "8", "--log-interval", "1",
    "--device", "cpu", "--no-progress", "--steps", "4", "--lr", "3e-3",
]  # fmt: skip
SWAPS = {
    # τ = 1 + tanh(0) + 0·log n is exactly 1 at the start.
    "selective": ["--attention", "selective", "--attention-option", "position_coefficient=linear"],
    # The identity composition, A' = A; global, since a local window would see fewer keys than Llama's layers.
    "dcmha": ["--attention", "dcmha", "--attention-option", "window_type=G"],
}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(HF Llama directory, the attnzoo directory `attnzoo convert` wrote from it)."""
    root = tmp_path_factory.mktemp("llama")
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,  # attention far from uniform, so a changed mechanism would show in the logits
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(root / "hf")
    assert main(["convert", "--from-hf", str(root / "hf"), "--out", str(root / "converted")]) == 0
    return root / "hf", root / "converted"


@pytest.fixture
def started(monkeypatch):
    """The model each `attnzoo train` of the test starts from, copied when its training loop begins."""
    models = []

    class RecordingTrainer(Trainer):
        def fit(self):
            models.append(_copy(self.raw_model))
            return super().fit()

    monkeypatch.setattr(train_command, "Trainer", RecordingTrainer)
    return models


def _copy(model):
    clone = type(model)(model.config)
    clone.load_state_dict(model.state_dict())
    return clone.eval()


@pytest.mark.parametrize("swap", SWAPS.values(), ids=SWAPS.keys())
def test_llama_to_a_swapped_mechanism_and_back_to_transformers(llama, swap, tmp_path, started):
    hf_dir, converted = llama
    run, out = tmp_path / "run", tmp_path / "hf-attnzoo"
    text = write_text_corpus(tmp_path / "text.txt")
    assert (
        main(["train", "--data", str(text), "--out", str(run), *RUN_FLAGS, "--init-from", str(converted), *swap]) == 0
    )
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    source = transformers.LlamaForCausalLM.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        source_logits = source(tokens).logits
        # The first step's model computes what the Llama did, up to fp32 round-off of the conversion.
        assert (started[0](tokens) - source_logits).abs().max() <= 1e-4

    hf.save_hf(run, out)
    hf.register()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    trained, _ = load_pretrained(run)
    assert isinstance(loaded, hf.AttnzooForCausalLM) and loaded.config.attention == swap[1]
    with torch.no_grad():
        logits = loaded(tokens).logits
        assert torch.equal(logits, trained(tokens))
        assert (logits - source_logits).abs().max() > 1e-3  # the steps trained it: the comparison above can fail
    prompt = tokens[:1, :8]
    assert torch.equal(
        loaded.generate(prompt, max_new_tokens=8, do_sample=False), trained.generate(prompt, 8, temperature=0)
    )
