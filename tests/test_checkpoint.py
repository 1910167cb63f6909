import json
import shutil

import pytest
import torch
from training_helpers import tiny_model_config, tiny_train_config, write_text_corpus

from attnzoo import Transformer
from attnzoo.data import prepare_corpus
from attnzoo.data.corpora import sha256_file
from attnzoo.distributed import Distributed
from attnzoo.training import CheckpointError, Trainer, load_pretrained, read_checkpoint
from attnzoo.training.checkpoint import (
    MANIFEST,
    TRAIN_STATE,
    complete_checkpoints,
    latest_checkpoint,
    load_train_state,
    manifest_digest,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 6-step run with checkpoints at steps 3 and 6, and its trainer."""
    root = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNZOO_CACHE_DIR", str(root / "cache"))
        text = write_text_corpus(root / "text.txt")
        corpus = prepare_corpus(str(text), "byte")
        trainer = Trainer(tiny_model_config(), tiny_train_config(text), corpus, root / "run", progress=False)
        trainer.fit()
    return trainer


@pytest.fixture
def run(trained, tmp_path):
    """A private copy of the trained run directory, to damage."""
    return shutil.copytree(trained.run_dir, tmp_path / "run")


def test_a_checkpoint_loads_as_the_model_that_wrote_it(trained, run):
    checkpoint = read_checkpoint(run)
    assert checkpoint.directory.name == "step-0000006" and checkpoint.step == 6 and checkpoint.world_size == 1
    assert checkpoint.model_config == trained.model_config and checkpoint.train_config == trained.cfg
    assert checkpoint.tokenizer == trained.corpus.tokenizer
    model, _ = load_pretrained(run)
    idx = torch.randint(0, 256, (2, 16))
    assert torch.equal(model(idx), trained.raw_model.eval()(idx))
    # The directory is also a plain pretrained model directory.
    assert torch.equal(Transformer.from_pretrained(checkpoint.directory)(idx), model(idx))


def test_only_complete_checkpoints_count_and_old_ones_are_pruned(run):
    assert [p.name for p in complete_checkpoints(run)] == ["step-0000003", "step-0000006"]
    # A save cut off before its manifest (the last file written) is not a checkpoint.
    (run / "checkpoints" / "step-0000006" / MANIFEST).unlink()
    assert latest_checkpoint(run).name == "step-0000003"
    assert read_checkpoint(run).step == 3


def test_keep_checkpoints_prunes_the_oldest(tmp_path):
    text = write_text_corpus(tmp_path / "text.txt")
    cfg = tiny_train_config(text, steps=8, checkpoint_interval=2, keep_checkpoints=2)
    Trainer(tiny_model_config(), cfg, prepare_corpus(str(text), "byte"), tmp_path / "run", progress=False).fit()
    assert [p.name for p in complete_checkpoints(tmp_path / "run")] == ["step-0000006", "step-0000008"]


@pytest.mark.parametrize("name", ["model.safetensors", TRAIN_STATE])
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_truncated_or_corrupted_files_are_reported_clearly(run, name, damage):
    path = run / "checkpoints" / "step-0000006" / name
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        del data[len(data) // 2 :]
    else:
        data[len(data) // 2] ^= 0xFF  # one bit pattern inside the tensor data: still parses
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"step-0000006 is damaged: {name} does not match the sha256"):
        read_checkpoint(run)


@pytest.mark.parametrize("name", [MANIFEST, "config.json", "tokenizer.json"])
def test_unreadable_json_is_reported_clearly(run, name):
    (run / "checkpoints" / "step-0000006" / name).write_text('{"step": 6, "trunc')
    with pytest.raises(CheckpointError, match=rf"{name} is damaged \(not readable JSON"):
        read_checkpoint(run)


def test_a_config_that_does_not_match_the_weights_is_reported_clearly(run):
    directory = run / "checkpoints" / "step-0000006"
    (directory / MANIFEST).unlink()  # a plain model directory, whose files no manifest covers
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["mlp_hidden_dim"] = 128
    config_path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"cannot load .*model\.safetensors into the model"):
        load_pretrained(directory)
    config["vocab_size"] = 100
    config_path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="the tokenizer has 256 tokens but the model's vocab_size is 100"):
        read_checkpoint(directory)


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        target = data
        *parents, leaf = key.split("__")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    path.write_text(json.dumps(data, indent=2))


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("config.json", {"rope_theta": 10001.0}),
        ("config.json", {"norm_eps": 2e-05}),
        ("tokenizer.json", {"kind": "byte", "extra": 1}),
    ],
)
def test_an_edited_config_or_tokenizer_in_a_checkpoint_is_refused(run, name, change):
    """Defect #17.2: a changed digit in config.json silently changed the model."""
    _edit_json(run / "checkpoints" / "step-0000006" / name, **change)
    with pytest.raises(CheckpointError, match=rf"step-0000006 is damaged: {name} does not match the sha256"):
        read_checkpoint(run)


@pytest.mark.parametrize(
    "change",
    [{"train_config__lr": 0.0021}, {"train_config__seed": 1}, {"train_config__seq_len": 8}, {"step": 5}],
    ids=["lr", "seed", "seq_len", "step"],
)
def test_an_edited_manifest_is_refused(run, change):
    """Defect #17.2: a changed digit in checkpoint.json silently changed the resumed run."""
    _edit_json(run / "checkpoints" / "step-0000006" / MANIFEST, **change)
    with pytest.raises(CheckpointError, match=r"step-0000006 is damaged: checkpoint\.json does not match its own"):
        read_checkpoint(run)


@pytest.mark.parametrize("hashes", [{}, None, "x", {"model.safetensors": "0"}], ids=["empty", "null", "str", "one"])
def test_a_manifest_without_its_hashes_is_refused(run, hashes):
    """Defect #17.2: a manifest with its hashes removed was accepted next to damaged weights."""
    directory = run / "checkpoints" / "step-0000006"
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["sha256"] = hashes
    manifest["self_sha256"] = manifest_digest(manifest)  # consistent with itself: only the hashes are gone
    (directory / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"checkpoint\.json records no sha256 for .*config\.json"):
        read_checkpoint(run)


def test_a_format_1_checkpoint_still_loads_with_a_warning(run, caplog):
    directory = run / "checkpoints" / "step-0000006"
    manifest = json.loads((directory / MANIFEST).read_text())
    del manifest["self_sha256"]
    manifest["format_version"] = 1
    manifest["sha256"] = {name: manifest["sha256"][name] for name in ("model.safetensors", TRAIN_STATE)}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    with caplog.at_level("WARNING"):
        assert read_checkpoint(run).step == 6
    assert "format-1 checkpoint" in caplog.text and "config.json" in caplog.text
    del manifest["sha256"][TRAIN_STATE]
    (directory / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"records no sha256 for train_state\.pt"):
        read_checkpoint(run)


def test_a_manifest_from_another_format_or_with_bad_fields_is_refused(run):
    manifest_path = run / "checkpoints" / "step-0000006" / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(CheckpointError, match="has checkpoint format 99; this attnzoo reads formats 1, 2"):
        read_checkpoint(run)
    bad = {**manifest, "train_config": {**manifest["train_config"], "lr": -1}}
    manifest_path.write_text(json.dumps({**bad, "self_sha256": manifest_digest(bad)}))
    with pytest.raises(CheckpointError, match=r"checkpoint\.json is invalid: .*lr=-1 is invalid"):
        read_checkpoint(run)


def test_missing_paths_and_empty_runs_are_reported_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        read_checkpoint(tmp_path / "empty")


class _Payload:
    """Unpickling this would run code: a checkpoint must never be loaded that way."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_training_state_is_loaded_without_unpickling_arbitrary_objects(trained, run, tmp_path):
    directory = run / "checkpoints" / "step-0000006"
    marker = tmp_path / "payload-ran"
    torch.save({"optimizer": _Payload(marker), "rng": []}, directory / TRAIN_STATE)
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["sha256"][TRAIN_STATE] = sha256_file(directory / TRAIN_STATE)  # a well-formed, hostile file
    manifest["self_sha256"] = manifest_digest(manifest)
    (directory / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"cannot restore the optimizer from .*train_state\.pt") as refused:
        load_train_state(read_checkpoint(run), trained.model, trained.optimizer, Distributed())
    assert not marker.exists()
    assert "weights_only" not in str(refused.value)  # torch's advice to turn the safety off is never passed on
