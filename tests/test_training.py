import errno
import itertools
import json
import math
import os
import re
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from training_helpers import tiny_model_config, tiny_train_config, write_text_corpus

from attnzoo import Transformer
from attnzoo.data import prepare_corpus
from attnzoo.distributed import Distributed
from attnzoo.training import (
    CheckpointError,
    DataConfig,
    TrainConfig,
    Trainer,
    TrainingDiverged,
    load_toml,
    read_checkpoint,
)
from attnzoo.training.checkpoint import complete_checkpoints, latest_checkpoint
from attnzoo.training.optim import build_optimizer, learning_rate, parameter_groups
from attnzoo.training.timing import seconds_per_step
from attnzoo.training.trainer import DivergenceWatch


@pytest.fixture
def text(tmp_path):
    return write_text_corpus(tmp_path / "text.txt")


def _losses(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}


def _train(text, run_dir, model_config=None, **changes):
    train_config = tiny_train_config(text, **changes)
    corpus = prepare_corpus(str(text), train_config.data.tokenizer)
    trainer = Trainer(model_config or tiny_model_config(), train_config, corpus, run_dir, progress=False)
    return trainer, trainer.fit()


def test_a_step_is_timed_from_the_trainers_own_log_and_says_nothing(text, capsys):
    train_config = tiny_train_config(text)
    corpus = prepare_corpus(str(text), train_config.data.tokenizer)
    env = Distributed(device=torch.device("cpu"))
    seconds = seconds_per_step(tiny_model_config(), train_config, corpus, env, steps=5)
    assert 0 < seconds < 60 and capsys.readouterr().out == ""


# --------------------------------------------------------------------------------------------------- config


def test_train_config_validates_and_round_trips_through_json():
    cfg = TrainConfig(steps=7, data=DataConfig(corpus="pystdlib", tokenizer="char"))
    assert TrainConfig.from_json(cfg.to_json()) == cfg
    assert TrainConfig.from_dict({"data": {"corpus": "x"}}).data == DataConfig(corpus="x")
    for bad, match in [
        ({"lr": -1.0}, "lr=-1.0 is invalid"),
        ({"batch_size": 0}, "batch_size=0 is invalid"),
        ({"seed": -1}, "seed=-1 is invalid"),
        ({"dtype": "float16"}, r"dtype='float16' is invalid: choose one of \['auto', 'float32', 'bfloat16'\]"),
        ({"data": {"tokenizer": "bpe"}}, "tokenizer='bpe' is invalid"),
        ({"learning_rate": 1.0}, r"unknown \[train\] setting\(s\) \['learning_rate'\]"),
        ({"data": {"path": "x"}}, r"unknown \[data\] setting\(s\) \['path'\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            TrainConfig.from_dict(bad)


def test_toml_files_hold_model_data_and_train_tables(tmp_path):
    good = tmp_path / "run.toml"
    good.write_text('[model]\ndim = 64\n[model.attention_options]\n[data]\ncorpus = "pystdlib"\n[train]\nlr = 1e-3\n')
    assert load_toml(good) == {
        "model": {"dim": 64, "attention_options": {}},
        "data": {"corpus": "pystdlib"},
        "train": {"lr": 1e-3},
    }
    (tmp_path / "bad.toml").write_text("[optim]\nlr = 1\n")
    with pytest.raises(ValueError, match=r"unknown table\(s\) or key\(s\) \['optim'\]"):
        load_toml(tmp_path / "bad.toml")
    (tmp_path / "broken.toml").write_text("[train\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_toml(tmp_path / "broken.toml")
    with pytest.raises(FileNotFoundError, match=r"missing\.toml not found"):
        load_toml(tmp_path / "missing.toml")


# ---------------------------------------------------------------------------------------------- optimizer


def test_weight_decay_applies_to_linear_weights_only():
    model = Transformer(tiny_model_config(position="learned", bias=True, norm="layernorm"))
    decay, no_decay = parameter_groups(model, weight_decay=0.1)
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    assert {id(p) for p in decay["params"]} == linear_weights - embeddings  # the tied lm_head is an embedding
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert all(p.dim() == 1 for p in no_decay["params"] if id(p) not in embeddings)  # norms and biases
    model.layers[0].mlp.requires_grad_(False)
    frozen = parameter_groups(model, 0.1)
    assert sum(len(g["params"]) for g in frozen) == sum(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_adamw_is_fused_on_cuda_only(device):
    """On CUDA the fused kernel takes the step; on the CPU torch's default path, which every stored CPU run used.
    Either way one step moves the weights as AdamW's own unfused reference does (fp32, rtol 1e-5)."""
    torch.manual_seed(0)
    model = Transformer(tiny_model_config()).to(device)
    reference = Transformer(tiny_model_config()).to(device)
    reference.load_state_dict(model.state_dict())
    cfg = TrainConfig(lr=1e-3, warmup_steps=0)
    optimizer = build_optimizer(model, cfg)
    assert optimizer.defaults["fused"] == (device == "cuda")
    plain = torch.optim.AdamW(parameter_groups(reference, cfg.weight_decay), lr=optimizer.param_groups[0]["lr"],
                              betas=(cfg.beta1, cfg.beta2), foreach=False)  # fmt: skip
    idx = torch.randint(0, model.config.vocab_size, (2, 16), device=device)
    for net, opt in ((model, optimizer), (reference, plain)):
        net(idx, idx)[1].backward()
        opt.step()
    for (name, param), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param, expected, rtol=1e-5, atol=1e-7, msg=name)


def test_learning_rate_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    cfg = TrainConfig(lr=1e-3, warmup_steps=10, steps=111, min_lr_ratio=0.1)
    lrs = [learning_rate(step, cfg) for step in range(cfg.steps)]
    assert lrs[:10] == pytest.approx([1e-4 * (i + 1) for i in range(10)])
    assert lrs[10] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)
    assert lrs[60] == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))  # half way through the cosine's 100 steps
    assert all(a > b for a, b in itertools.pairwise(lrs[10:]))


# ------------------------------------------------------------------------------------------------- trainer


def test_a_tiny_run_learns_and_leaves_a_complete_run_directory(text, tmp_path):
    run = tmp_path / "run"
    trainer, result = _train(text, run, steps=30, eval_interval=10, checkpoint_interval=10, lr=1e-2)
    assert result.step == 30 and result.interrupted_by is None
    assert result.val.loss < math.log(256) - 2  # far below the uniform prediction over bytes
    losses = _losses(run)
    assert sorted(losses) == list(range(1, 31)) and losses[30] < losses[1] - 2
    for name in ("config.json", "train_config.json", "tokenizer.json", "run.json", "metrics.jsonl"):
        assert (run / name).is_file(), name
    assert json.loads((run / "run.json").read_text())["attnzoo_version"]
    assert (run / "train_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert TrainConfig.from_json((run / "train_config.json").read_text()) == trainer.cfg
    assert [c.name for c in complete_checkpoints(run)] == ["step-0000010", "step-0000020", "step-0000030"]


def test_the_run_says_when_it_reads_its_training_split_more_than_once(text, tmp_path):
    """An H100 run of 2026-11-26 read a 9.6M-token split 6.8 times and overfit; the header now says so."""
    corpus = prepare_corpus(str(text), "byte")

    def train_line(steps):
        cfg = tiny_train_config(text, steps=steps)
        header = Trainer(tiny_model_config(), cfg, corpus, tmp_path / f"run{steps}", progress=False).describe()
        return cfg.steps * cfg.tokens_per_step / len(corpus.train), next(
            line for line in header.splitlines() if line.startswith("train  ")
        )

    passes, line = train_line(1)
    assert passes < 1 and "passes" not in line
    passes, line = train_line(400)
    assert passes > 2 and f"({passes:.1f} passes over the training split)" in line


def test_resumed_run_is_bitwise_identical_to_the_uninterrupted_one(text, tmp_path):
    # Dropout makes the RNG state part of what must be restored.
    model_config = tiny_model_config(dropout=0.1)
    _, full = _train(text, tmp_path / "full", model_config, steps=6, checkpoint_interval=3)
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full", resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "step-0000006")  # as if stopped right after step 3
    checkpoint = read_checkpoint(resumed_dir)
    assert checkpoint.step == 3
    train_config = tiny_train_config(text, steps=6, checkpoint_interval=3)
    corpus = prepare_corpus(str(text), "byte")
    trainer = Trainer(model_config, train_config, corpus, resumed_dir, resume=checkpoint, progress=False)
    assert trainer.restored_rng
    resumed = trainer.fit()
    assert resumed.step == 6
    assert _losses(resumed_dir) == _losses(tmp_path / "full")  # steps 4-6 recomputed, exactly
    final = "checkpoints/step-0000006/model.safetensors"
    a, b = load_file(tmp_path / "full" / final), load_file(resumed_dir / final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert full.val == resumed.val


def test_gradient_accumulation_matches_one_big_batch(text, tmp_path):
    _, one = _train(text, tmp_path / "one", steps=3)
    _, four = _train(text, tmp_path / "four", steps=3, grad_accum=4)
    assert _losses(tmp_path / "four") == pytest.approx(_losses(tmp_path / "one"), rel=1e-5)
    assert four.val.loss == pytest.approx(one.val.loss, rel=1e-5)


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(text, tmp_path):
    run = tmp_path / "run"
    train_config = tiny_train_config(text, steps=10, checkpoint_interval=2)
    trainer = Trainer(tiny_model_config(), train_config, prepare_corpus(str(text), "byte"), run, progress=False)

    def poison_after_step_4(module, inputs, output):
        return output * math.nan if trainer.step >= 4 else output

    trainer.raw_model.lm_head.register_forward_hook(poison_after_step_4)
    with pytest.raises(TrainingDiverged, match=r"step 5: the loss is nan.*last good checkpoint is .*step-0000004"):
        trainer.fit()
    assert latest_checkpoint(run).name == "step-0000004"
    good = read_checkpoint(run)  # verifies the checkpoint's hashes
    assert good.step == 4
    saved = load_file(good.directory / "model.safetensors")
    assert all(
        torch.equal(saved[name], p.detach()) for name, p in trainer.raw_model.state_dict().items() if name in saved
    )


def test_resume_refuses_a_different_model_or_optimisation_but_allows_runtime_changes(text, tmp_path):
    _train(text, tmp_path / "run", steps=3)
    checkpoint = read_checkpoint(tmp_path / "run")
    corpus = prepare_corpus(str(text), "byte")
    with pytest.raises(CheckpointError, match=r"model differs .*'dim': \(32, 64\)"):
        Trainer(tiny_model_config(dim=64), tiny_train_config(text), corpus, tmp_path / "run", resume=checkpoint)
    with pytest.raises(CheckpointError, match=r"resuming cannot change \{'lr'"):
        Trainer(
            tiny_model_config(), tiny_train_config(text, steps=3, lr=0.5), corpus, tmp_path / "run", resume=checkpoint
        )
    allowed = tiny_train_config(text, steps=3, eval_interval=1, keep_checkpoints=1)
    assert Trainer(tiny_model_config(), allowed, corpus, tmp_path / "run", resume=checkpoint).step == 3


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace("the", "thy", 1),  # same length, one word changed
        lambda t: t[: len(t) // 2],
    ],
    ids=["one-word", "halved"],
)
def test_resume_refuses_changed_training_data(text, tmp_path, edit):
    """Defect #17.3: the corpus edited between the interruption and the resume; the resume diverged silently."""
    _train(text, tmp_path / "run", steps=3)
    checkpoint = read_checkpoint(tmp_path / "run")
    text.write_text(edit(text.read_text()))
    corpus = prepare_corpus(str(text), "byte")
    with pytest.raises(CheckpointError, match=r"training data changed since .*run started.*tokens.*restore the data"):
        Trainer(tiny_model_config(), tiny_train_config(text, steps=3), corpus, tmp_path / "run", resume=checkpoint)


def test_resume_accepts_the_same_data_touched_and_re_prepared(text, tmp_path, monkeypatch):
    _train(text, tmp_path / "run", steps=3)
    checkpoint = read_checkpoint(tmp_path / "run")
    text.write_text(text.read_text())  # a new mtime, the same text
    monkeypatch.setenv("ATTNZOO_CACHE_DIR", str(tmp_path / "other-cache"))
    corpus = prepare_corpus(str(text), "byte")
    trainer = Trainer(
        tiny_model_config(), tiny_train_config(text, steps=3), corpus, tmp_path / "run", resume=checkpoint
    )
    assert trainer.step == 3


def test_a_fresh_start_forgets_the_records_of_a_start_that_saved_no_checkpoint(text, tmp_path):
    """Defect #17.11: the old metrics.jsonl records stayed (20 duplicated steps, drawn in the plot)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train_loss": 9.0}) + "\n" for s in (1, 2)))
    _train(text, run, steps=2)
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "train_loss" in r]
    assert steps == [1, 2] and 9.0 not in _losses(run).values()


def test_an_interrupted_run_logs_what_the_uninterrupted_one_logs(text, tmp_path):
    """Defect #17.11: an interrupted run logged one extra record at the stop step."""
    _train(text, tmp_path / "full", steps=6, log_interval=2, eval_interval=6)
    train_config = tiny_train_config(text, steps=6, log_interval=2, eval_interval=6)
    corpus = prepare_corpus(str(text), "byte")
    trainer = Trainer(tiny_model_config(), train_config, corpus, tmp_path / "cut", progress=False)
    original = trainer.train_step

    def stop_after_step_3():
        loss, grad_norm, _ = original()
        return loss, grad_norm, trainer.step == 3

    trainer.train_step = stop_after_step_3
    trainer._stop_signal = signal.SIGINT
    trainer.fit()
    assert latest_checkpoint(tmp_path / "cut").name == "step-0000003"
    resumed = Trainer(
        tiny_model_config(), train_config, corpus, tmp_path / "cut", resume=read_checkpoint(tmp_path / "cut")
    )
    resumed.progress = False
    resumed.fit()
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "full")


def test_sigterm_during_the_last_step_is_honoured_and_said(text, tmp_path, capsys):
    """A SIGTERM in the last step was dropped: the run returned as if uninterrupted and a compare went on."""
    train_config = tiny_train_config(text, steps=2, eval_interval=2, checkpoint_interval=2)
    trainer = Trainer(tiny_model_config(), train_config, prepare_corpus(str(text), "byte"), tmp_path, progress=False)
    original = trainer.train_step

    def sigterm_in_the_last_step():
        if trainer.step == train_config.steps - 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return original()

    trainer.train_step = sigterm_in_the_last_step
    result = trainer.fit()
    assert (result.step, result.interrupted_by) == (2, signal.SIGTERM)
    assert latest_checkpoint(tmp_path).name == "step-0000002"
    said = capsys.readouterr().out
    assert "SIGTERM during the last step: the run finished its 2 steps and saved " in said, said


def test_a_full_disk_while_saving_names_the_disk_and_the_last_good_checkpoint(text, tmp_path, monkeypatch):
    from attnzoo.training import checkpoint as checkpoint_module

    run = tmp_path / "run"
    trainer = Trainer(tiny_model_config(), tiny_train_config(text, steps=4, checkpoint_interval=2),
                      prepare_corpus(str(text), "byte"), run, progress=False)  # fmt: skip
    real_save = checkpoint_module.save_file

    def full_after_step_2(tensors, filename, metadata=None):
        if trainer.step > 2:
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        return real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(checkpoint_module, "save_file", full_after_step_2)
    said = r"step 4: .*model.safetensors: the disk is full \(the disk mounted at /.*\)\. Nothing was lost: .*-0000002"
    with pytest.raises(CheckpointError, match=said):
        trainer.fit()
    assert read_checkpoint(run).step == 2
    assert not (run / "checkpoints" / "step-0000004").exists()  # the torn checkpoint gave its space back


def test_a_corpus_too_small_for_one_window_is_refused(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("x" * 200)
    with pytest.raises(ValueError, match=r"val split of corpus 'short.txt' has 20 tokens, fewer than one window"):
        _train(short, tmp_path / "run")


def test_a_finite_divergence_stops_the_run_naming_the_cause_and_the_checkpoint_before_it(text, tmp_path):
    """At --lr 1e6 a run trained on at the uniform loss, ln(vocab_size), and kept checkpointing it."""
    run = tmp_path / "run"
    train_config = tiny_train_config(text, steps=40, warmup_steps=2, checkpoint_interval=4)
    trainer = Trainer(tiny_model_config(), train_config, prepare_corpus(str(text), "byte"), run, progress=False)

    def uniform_from_step_20(module, inputs, output):  # every logit alike: the loss is exactly ln(256)
        return output * 0 if trainer.step >= 20 else output

    trainer.raw_model.lm_head.register_forward_hook(uniform_from_step_20)
    said = r"step 30: .*at or above 5.5452 = ln\(vocab_size\).* for 10 steps .*, since step 21\. .*--lr=0\.002"
    with pytest.raises(TrainingDiverged, match=said) as stop:
        trainer.fit()
    assert re.search(r"last checkpoint before it is .*step-0000016: .*--init-from", str(stop.value)), stop.value
    assert latest_checkpoint(run).name == "step-0000028"  # not removed: the message names the one to use


def test_the_divergence_watch_stops_a_sustained_jump_and_lets_a_spike_pass():
    falling = [3.0 - 0.1 * step for step in range(20)]  # to 1.1; warmup 2, judged from step 12
    spike, jump = [4.0] * 9, [4.0] * 10  # above 2× the lowest smoothed loss, below ln(256)
    for losses, stops_at in [(falling + spike + falling[-1:], None), (falling + jump, 30)]:
        watch = DivergenceWatch(uniform_loss=math.log(256), watch_from=12)
        verdicts = [watch.update(step, loss) for step, loss in enumerate(losses, start=1)]
        stopped = [step for step, why in enumerate(verdicts, start=1) if why is not None]
        assert stopped[:1] == ([stops_at] if stops_at else []), verdicts
    said = r"the training loss has stayed above 2× its lowest \(1\.\d+, smoothed\) for 10 steps \(now 4\.0000\)"
    assert re.match(said, verdicts[29]), verdicts[29]


def test_a_healthy_run_at_a_near_uniform_start_is_not_taken_for_a_divergence(text, tmp_path):
    """A fresh model's loss starts at about ln(vocab_size): the watch waits for warmup and one smoothing span."""
    result = Trainer(tiny_model_config(), tiny_train_config(text, steps=30, warmup_steps=0),
                     prepare_corpus(str(text), "byte"), tmp_path / "run", progress=False).fit()  # fmt: skip
    assert result.step == 30
