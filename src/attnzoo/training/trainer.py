"""The training loop.

``Trainer(model_config, train_config, corpus, run_dir).fit()`` trains a :class:`~attnzoo.Transformer`
and leaves in ``run_dir``::

    config.json  train_config.json  tokenizer.json  run.json    what was trained, how, on what, with what
    metrics.jsonl                                               train and validation metrics by step
    train_loss.png                                              the loss curves, drawn when fit() returns
    checkpoints/step-NNNNNNN/                                   see attnzoo.training.checkpoint

Every step is a pure function of the state at its start and (seed, step), so a run resumed from the
checkpoint of step k makes exactly the updates the uninterrupted run makes. SIGINT and SIGTERM finish
the current step, write a checkpoint and return; a non-finite loss or gradient stops the run before it
touches the weights, so the last checkpoint stays good.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import platform
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from torch.distributed.tensor import DTensor
from tqdm import tqdm

from attnzoo import __version__
from attnzoo.attention.kernels import Call, planned_backend_refusal
from attnzoo.config import ModelConfig
from attnzoo.data.batches import BatchSchedule
from attnzoo.data.corpora import Corpus, prepare_corpus
from attnzoo.data.tokenizers import Tokenizer
from attnzoo.distributed import Distributed, gradient_sync, parallelize
from attnzoo.evals.lm import LMEvalConfig, LMScore, evaluate_lm
from attnzoo.io import DISK_FULL, DirectoryLocked, atomic_write_text, locked_directory, mount_point
from attnzoo.machine import emulated_bf16
from attnzoo.model import CONFIG_NAME, Transformer
from attnzoo.training.checkpoint import (
    TOKENIZER,
    Checkpoint,
    CheckpointError,
    complete_checkpoints,
    latest_checkpoint,
    load_train_state,
    load_weights,
    save_checkpoint,
    step_directory,
    tied_parameter_names,
)
from attnzoo.training.config import RESUME_OVERRIDABLE, DataConfig, TrainConfig, check_model_for_training
from attnzoo.training.finetune import (
    PretrainedInit,
    check_tokenizer,
    count_trainable,
    freeze_all_but,
    init_from_pretrained,
)
from attnzoo.training.metrics import MetricsLog, TensorBoardLog, plot_losses, require_tensorboard
from attnzoo.training.optim import build_optimizer, learning_rate
from attnzoo.validation import require

logger = logging.getLogger(__name__)

METRICS = "metrics.jsonl"
LOSS_PLOT = "train_loss.png"
DROPOUT_STREAM = 1  # tags the per-rank dropout RNG stream, apart from the initialisation stream


class TrainingDiverged(RuntimeError):
    """The loss or gradient became NaN or infinite, or the loss diverged while staying finite."""


@dataclass
class DivergenceWatch:
    """Divergence that stays finite: a run at too high a learning rate can sit at the loss of a uniform guess,
    ln(vocab_size), and keep checkpointing it. The run has diverged when, past warmup, its loss stays for
    ``span`` steps in a row at or above the uniform level (less ``margin``), or above ``jump_factor`` times the
    lowest its smoothed loss (an exponential mean over about ``span`` steps) has been. The first ``span`` steps
    after warmup are not judged, so that a fresh model's near-uniform start is not taken for a divergence."""

    uniform_loss: float  # ln(vocab_size): what predicting every token alike scores
    watch_from: int  # the first step judged
    span: int = 10
    jump_factor: float = 2.0
    margin: float = 0.01
    smoothed: float = math.nan
    lowest: float = math.inf
    onset: int | None = None  # the first step of the current stretch in the diverged range

    def update(self, step: int, loss: float) -> str | None:
        """Record ``loss`` of ``step``; return why the run diverged, or ``None``."""
        uniform, jumped = self.uniform_loss - self.margin, self.jump_factor * self.lowest
        if loss < min(uniform, jumped):
            self.onset = None
            weight = 2 / (self.span + 1)
            self.smoothed = loss if math.isnan(self.smoothed) else (1 - weight) * self.smoothed + weight * loss
            if step >= self.watch_from:
                self.lowest = min(self.lowest, self.smoothed)
            return None
        if self.onset is None:
            self.onset = step
        if step < self.watch_from or step - self.onset + 1 < self.span:
            return None
        if loss >= uniform:
            return (
                f"the training loss has stayed at or above {self.uniform_loss:.4f} = ln(vocab_size), the loss of "
                f"predicting every token alike, for {step - self.onset + 1} steps (now {loss:.4f})"
            )
        return (
            f"the training loss has stayed above {self.jump_factor:g}× its lowest ({self.lowest:.4f}, smoothed) "
            f"for {step - self.onset + 1} steps (now {loss:.4f})"
        )


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    step: int
    interrupted_by: int | None  # the signal that asked the run to stop, if any (also one in its last step)
    train_loss: float
    val: LMScore | None  # the last evaluation
    tokens_per_second: float  # training throughput of this session, evaluation and checkpoints excluded
    seconds: float  # wall time of this session


def derive_seed(*entropy: int) -> int:
    """A seed for an independent random stream identified by ``entropy``, e.g. (seed, purpose, rank)."""
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 1)


def load_corpus(data: DataConfig, env: Distributed, tokenizer: Tokenizer | None = None) -> Corpus:
    """Rank 0 fetches and tokenizes first; the other ranks then read its cache."""
    args = (data.corpus, tokenizer or data.tokenizer, data.val_fraction)
    if env.is_main:
        corpus = prepare_corpus(*args)
    env.barrier()
    if not env.is_main:
        corpus = prepare_corpus(*args)
    return corpus


def check_resumable(checkpoint: Checkpoint, model_config: ModelConfig, train_config: TrainConfig) -> None:
    """Refuse to continue a checkpoint with a different model or different optimisation."""
    if not checkpoint.resumable:
        raise CheckpointError(f"{checkpoint.directory} holds a model but no training state to resume")
    if checkpoint.model_config != model_config:
        theirs, ours = checkpoint.model_config.to_dict(), model_config.to_dict()
        changed = {k: (theirs[k], ours[k]) for k in ours if theirs[k] != ours[k]}
        raise CheckpointError(f"the model differs from the checkpoint's in {changed} (checkpoint, requested)")
    theirs, ours = checkpoint.train_config.to_dict(), train_config.to_dict()
    changed = {k: (theirs[k], ours[k]) for k in ours if theirs[k] != ours[k] and k not in RESUME_OVERRIDABLE}
    if changed:
        raise CheckpointError(
            f"resuming cannot change {changed} (checkpoint, requested): that would not continue the same run. "
            f"Only {sorted(RESUME_OVERRIDABLE)} may change on resume."
        )


def _data_identity(corpus_info: dict) -> dict:
    """What identifies a run's token stream in ``run.json``'s corpus record: its token count and, when the
    cache recorded it, the sha256 of its tokens."""
    identity = {"tokens": corpus_info.get("num_tokens")}
    hashes = corpus_info.get("files_sha256")
    if isinstance(hashes, dict) and "tokens.bin" in hashes:
        identity["tokens sha256"] = hashes["tokens.bin"]
    return identity


def check_same_data(run_dir: Path, corpus: Corpus) -> None:
    """Refuse to resume ``run_dir`` on a token stream other than the one its ``run.json`` records: a run
    continued on edited text would silently diverge from the one it claims to continue."""
    try:
        recorded = json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8"))["corpus"]
    except FileNotFoundError:
        return  # a checkpoint copied out of its run: nothing recorded to compare with
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"{Path(run_dir) / 'run.json'} is unreadable ({err}), so its data cannot be compared"
        ) from None
    then, now = _data_identity(recorded), _data_identity(corpus.info)
    changed = {key: (then[key], now[key]) for key in then.keys() & now.keys() if then[key] != now[key]}
    if changed:
        raise CheckpointError(
            f"the training data changed since {run_dir} started: corpus {recorded.get('name')!r} then, "
            f"{corpus.name!r} now, differing in {changed} (then, now). Resuming on other data would not continue "
            f"the same run: restore the data it was trained on, or start a new run with --init-from {run_dir}."
        )


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """A ``TrainConfig.dtype``: 'auto' is bfloat16 autocast on CUDA devices that support it, float32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, name)


@contextlib.contextmanager
def lock_run_directory(run_dir: str | Path, env: Distributed) -> Iterator[None]:
    """Rank 0 holds the run directory's lock (see :func:`attnzoo.io.locked_directory`) while the block runs;
    if another process holds it, every rank raises :class:`~attnzoo.io.DirectoryLocked`, so none is left
    waiting in a collective. Nests within one process."""
    with contextlib.ExitStack() as stack:
        holder = None  # (the holder's pid,) when another process holds the lock
        if env.is_main:
            try:
                stack.enter_context(locked_directory(run_dir, "run"))
            except DirectoryLocked as err:
                holder = (err.pid,)
        holder = env.broadcast(holder)
        if holder is not None:
            raise DirectoryLocked(Path(run_dir), holder[0], "run")
        yield


class Trainer:
    def __init__(
        self,
        model_config: ModelConfig,
        train_config: TrainConfig,
        corpus: Corpus,
        run_dir: str | Path,
        *,
        env: Distributed | None = None,
        resume: Checkpoint | None = None,
        init_from: Checkpoint | None = None,
        progress: bool = True,
        tensorboard: str | Path | None = None,
    ):
        """``resume`` continues the run of that checkpoint. ``init_from`` starts a new run from a pretrained
        model's weights instead of random ones; ``model_config`` may differ from its in the attention
        (see :mod:`attnzoo.training.finetune`). ``tensorboard``: a directory that also receives the metrics as
        TensorBoard scalars (needs the optional ``tensorboard`` package)."""
        if tensorboard is not None:
            require_tensorboard()  # on every rank, so that all refuse together
        self.model_config, self.cfg, self.corpus = model_config, train_config, corpus
        self.run_dir, self.env, self.progress = Path(run_dir), env or Distributed(), progress
        self._check_inputs(resume, init_from)
        self.batches = BatchSchedule(
            corpus.train,
            seq_len=train_config.seq_len,
            batch_size=train_config.batch_size,
            grad_accum=train_config.grad_accum,
            seed=train_config.seed,
            rank=self.env.rank,
            world_size=self.env.world_size,
        )
        # Unwrapped: FSDP shards it in place, DDP wraps it.
        self.raw_model, self.pretrained_init = self._build_model(resume, init_from)
        self._check_named_kernel()
        self.tied_names = tied_parameter_names(self.raw_model)
        self.model = parallelize(self.raw_model, self.env, train_config.parallel)
        self.optimizer = build_optimizer(self.model, train_config)
        self.step = resume.step if resume is not None else 0
        self.restored_rng = resume is not None and load_train_state(resume, self.model, self.optimizer, self.env)
        if not self.restored_rng:
            torch.manual_seed(derive_seed(train_config.seed, DROPOUT_STREAM, self.env.rank))
        self.last_checkpoint = resume.directory if resume is not None else None
        self.metrics = MetricsLog(self.run_dir / METRICS)
        self.tensorboard_dir = Path(tensorboard) if tensorboard is not None else None
        self._stop_signal: int | None = None

    def _check_inputs(self, resume: Checkpoint | None, init_from: Checkpoint | None) -> None:
        if init_from is not None:
            if resume is not None:
                raise ValueError("a run resumes from its own checkpoint or starts from a pretrained one, not both")
            check_tokenizer(init_from, self.corpus.tokenizer)
        check_model_for_training(self.model_config, self.cfg, self.corpus.tokenizer.vocab_size)
        for split in ("train", "val"):
            size = len(getattr(self.corpus, split))
            if size < self.cfg.seq_len + 1:
                raise ValueError(
                    f"the {split} split of corpus {self.corpus.name!r} has {size} tokens, fewer than one window "
                    f"of seq_len + 1 = {self.cfg.seq_len + 1}; use more text or a shorter seq_len"
                )
        if resume is not None:
            check_resumable(resume, self.model_config, self.cfg)
            if resume.tokenizer != self.corpus.tokenizer:
                raise CheckpointError(f"{resume.directory} was trained with a different tokenizer than the corpus's")
            check_same_data(self.run_dir, self.corpus)

    def _build_model(
        self, resume: Checkpoint | None, init_from: Checkpoint | None
    ) -> tuple[Transformer, PretrainedInit | None]:
        """The model with its starting weights, all but ``train_only`` frozen: initialised from the seed, then
        given the checkpoint's weights when resuming, or the pretrained model's (the parameters that one
        lacks keep the seed's init or start at identity)."""
        torch.manual_seed(self.cfg.seed)  # the same initial weights on every rank
        Transformer.check_fits(self.model_config, self.env.device)
        model = Transformer(self.model_config).to(self.env.device)
        pretrained_init = None
        if resume is not None:
            load_weights(resume, model)
        elif init_from is not None:
            pretrained_init = init_from_pretrained(model, init_from)
        if self.cfg.train_only:
            freeze_all_but(model, self.cfg.train_only)  # before parallelize: DDP and FSDP read it when wrapping
        if self.cfg.compile:
            for block in model.layers:  # block by block, as torchtitan does: compiles faster, composes with FSDP
                block.compile()
        return model, pretrained_init

    @property
    def dtype(self) -> torch.dtype:
        return resolve_dtype(self.cfg.dtype, self.env.device)

    def _check_named_kernel(self) -> None:
        """A kernel named as ``attn_backend`` serves this run's training steps, or the run is refused before it
        starts rather than train on the eager reference. Planned as the first step's call, which would build the
        C++ extension where the kernel needs it, so the check may build it."""
        call = Call.planned(
            self.model_config,
            self.raw_model.position,
            device_type=self.env.device.type,
            dtype=self.dtype,
            length=self.cfg.seq_len,
            compiling=self.cfg.compile,
            build=True,
        )
        steps = f"this run's training steps ({self.env.device.type}, {str(self.dtype).removeprefix('torch.')})"
        refusal = planned_backend_refusal((block.self_attn for block in self.raw_model.layers), call, steps)
        require(refusal is None, "attn_backend", self.model_config.attn_backend, refusal or "")

    def warnings(self) -> list[str]:
        """The config's (valid settings almost certainly not meant) and the machine's: bf16 emulated on this CPU."""
        emulated = emulated_bf16(self.env.device.type) if self.dtype == torch.bfloat16 else None
        return [*self.cfg.warnings(), *([emulated] if emulated is not None else [])]

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=self.dtype)

    def _write_run_files(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.model_config.to_json(self.run_dir / CONFIG_NAME)
        atomic_write_text(self.run_dir / "train_config.json", self.cfg.to_json())
        atomic_write_text(self.run_dir / TOKENIZER, json.dumps(self.corpus.tokenizer.to_dict()) + "\n")
        run = {
            "attnzoo_version": __version__,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "platform": platform.platform(),
            "device": str(self.env.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "world_size": self.env.world_size,
            "torch_threads": torch.get_num_threads(),
            "attention_kernels": self.attention_kernels(),
            "parameters": self.raw_model.num_parameters(),
            "trainable_parameters": count_trainable(self.raw_model),
            "init_from": self.pretrained_init.to_dict() if self.pretrained_init is not None else None,
            "corpus": {**self.corpus.info, "train_tokens": len(self.corpus.train), "val_tokens": len(self.corpus.val)},
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": sys.argv,
        }
        atomic_write_text(self.run_dir / "run.json", json.dumps(run, indent=2) + "\n")

    def attention_kernels(self) -> list[str]:
        """The kernel each layer's attention runs in this run's training steps, by name: asked before the first step,
        which would build the C++ extension where a kernel needs it, so the answer may build it."""
        kernels = self.raw_model.planned_kernels(
            device_type=self.env.device.type,
            dtype=self.dtype,
            length=self.cfg.seq_len,
            compiling=self.cfg.compile,
            build=True,
        )
        return [kernel.name for kernel in kernels]

    def describe(self) -> str:
        m, c = self.model_config, self.cfg
        kv = f", {m.n_kv_heads} kv heads" if m.n_kv_heads != m.n_heads else ""
        total, trainable = self.raw_model.num_parameters(), count_trainable(self.raw_model)
        frozen = f" ({trainable:,} trained, the rest frozen: train_only {list(c.train_only)})" if c.train_only else ""
        total_tokens = c.steps * c.tokens_per_step
        init = self.pretrained_init.describe() if self.pretrained_init is not None else []
        return "\n".join(
            [
                f"attnzoo {__version__} → {self.run_dir}",
                f"model  {m.attention} attention + {m.position} positions: dim {m.dim}, {m.n_layers} layers, "
                f"{m.n_heads} heads{kv}, {total:,} parameters{frozen}",
                *init,
                f"data   {self.corpus.name} ({self.corpus.tokenizer.kind} tokenizer, vocab {m.vocab_size}): "
                f"{len(self.corpus.train):,} train / {len(self.corpus.val):,} val tokens",
                f"train  {c.steps} steps × {c.batch_size} sequences × {c.seq_len} tokens = {total_tokens:,} tokens"
                f"{_passes(total_tokens, len(self.corpus.train))}, AdamW lr {c.lr:g} (warmup {c.warmup_steps}, "
                f"cosine to {c.lr * c.min_lr_ratio:g})",
                f"device {self.env.device.type} × {self.env.world_size} process(es), "
                f"{torch.get_num_threads()} torch thread(s), {str(self.dtype).removeprefix('torch.')}",
            ]
        )

    def train_step(self) -> tuple[float, float, bool]:
        """One optimizer step on the batch of ``self.step``: (mean loss over ranks, gradient norm, stop?)."""
        device = self.env.device
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step, self.cfg)
        micro_batches = self.batches.micro_batches(self.step)
        loss_sum = torch.zeros((), device=device)
        for i, (inputs, targets) in enumerate(micro_batches):
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            with gradient_sync(self.model, enabled=i == len(micro_batches) - 1):
                with self.autocast():
                    _, loss = self.model(inputs, targets)
                (loss / len(micro_batches)).backward()
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip or math.inf)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        # One collective agrees on the loss and on stopping, so every rank leaves the loop at the same step.
        stop = float(self._stop_signal is not None)
        shared = self.env.all_reduce_sum(torch.stack([loss_sum / len(micro_batches), loss_sum.new_tensor(stop)]))
        loss_value, stop_votes, grad_norm_value = (*shared.tolist(), grad_norm.item())
        loss_value /= self.env.world_size
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm_value)):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(self._divergence_message(loss_value, grad_norm_value))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss_value, grad_norm_value, stop_votes > 0

    def _divergence_message(self, loss: float, grad_norm: float) -> str:
        checkpoint = latest_checkpoint(self.run_dir)
        kept = f"the last good checkpoint is {checkpoint}" if checkpoint else "no checkpoint had been written yet"
        if self.step == 0:  # no update has been made: the learning rate cannot be the cause
            return (
                f"stopped at step 1: the loss is {loss} and the gradient norm {grad_norm} at the initial weights, "
                f"before any update. Start again with a smaller --init-std (it is {self.model_config.init_std:g}; "
                "the default is 0.02)."
            )
        return (
            f"stopped at step {self.step + 1}: the loss is {loss} and the gradient norm {grad_norm}. The weights "
            f"were not updated with them and {kept}. Start again with a lower --lr, a longer --warmup-steps or "
            "a smaller --grad-clip."
        )

    def _finite_divergence_message(self, why: str, onset: int) -> str:
        # The loss of step k is that of the weights after k - 1 updates: checkpoint k - 1 already holds them.
        first_bad = step_directory(self.run_dir, onset - 1)
        before = [path for path in complete_checkpoints(self.run_dir) if path < first_bad]
        kept = (
            f"The last checkpoint before it is {before[-1]}: start a new run from it with --init-from {before[-1]} "
            "and a lower --lr"
            if before
            else "No checkpoint was written before it: start again with a lower --lr"
        )
        return (
            f"stopped at step {self.step}: {why}, since step {onset}. The run has diverged; the likely cause is a "
            f"learning rate too high (--lr={self.cfg.lr:g}) or initial weights too large "
            f"(--init-std={self.model_config.init_std:g}). {kept} (or a longer --warmup-steps, a smaller --grad-clip)."
        )

    def evaluate(self) -> LMScore:
        micro_batch = self.batches.micro_batch_size
        return evaluate_lm(
            self.raw_model,
            self.corpus.val,
            self.corpus.tokenizer.token_bytes(),
            LMEvalConfig(self.cfg.seq_len, batch_size=micro_batch, max_windows=self.cfg.eval_windows),
            env=self.env,
            autocast=self.autocast(),
        )

    def save(self) -> None:
        if self.last_checkpoint == step_directory(self.run_dir, self.step):
            return  # already saved at this step (e.g. resumed here, or interrupted right after a checkpoint)
        self.last_checkpoint = save_checkpoint(
            self.run_dir,
            step=self.step,
            model=self.model,
            optimizer=self.optimizer,
            model_config=self.model_config,
            train_config=self.cfg,
            tokenizer=self.corpus.tokenizer,
            env=self.env,
            tied_names=self.tied_names,
        )

    def _write_failure_message(self, err: OSError) -> str:
        """Why the run stopped on a failed write (disk full, quota, permissions), and that its last checkpoint
        is intact: every file is written atomically and a checkpoint counts once its manifest is written."""
        directory = step_directory(self.run_dir, self.step)
        if self.env.is_main and directory.exists() and directory not in complete_checkpoints(self.run_dir):
            shutil.rmtree(directory, ignore_errors=True)  # a torn checkpoint: never read, and it holds the space
        kept = latest_checkpoint(self.run_dir)
        if kept is not None:
            nothing_lost = (
                f"Nothing was lost: the last good checkpoint, {kept}, is intact; free some space and continue "
                f"with: attnzoo train --resume {self.run_dir}"
            )
        else:
            nothing_lost = "No checkpoint had been written yet; free some space and start the run again."
        why = "the disk is full" if err.errno in DISK_FULL else err.strerror or str(err)
        return (
            f"stopped at step {self.step}: could not write {err.filename or self.run_dir}: {why} "
            f"(the disk mounted at {mount_point(self.run_dir)}). {nothing_lost}"
        )

    def fit(self) -> TrainResult:
        """Train to ``steps``, or until SIGINT/SIGTERM; evaluate, log and checkpoint along the way.

        The run directory is locked while this runs: another process training into it, or resuming it, gets
        :class:`~attnzoo.io.DirectoryLocked` naming this one's pid instead of interleaving its writes."""
        with lock_run_directory(self.run_dir, self.env):
            tracker = TensorBoardLog(self.tensorboard_dir) if self.tensorboard_dir and self.env.is_main else None
            try:
                return self._fit(tracker)
            except OSError as err:
                raise CheckpointError(self._write_failure_message(err)) from None
            finally:
                if tracker is not None:
                    tracker.close()

    def _fit(self, tracker: TensorBoardLog | None) -> TrainResult:
        cfg, main = self.cfg, self.env.is_main

        def log(record: dict) -> None:
            self.metrics.append(record)
            if tracker is not None:
                tracker.append(record)

        if main:
            if self.last_checkpoint is None:
                self._write_run_files()
                self.metrics.clear()  # records of an earlier start that wrote no checkpoint are not this run's
            else:
                self.metrics.truncate_after(self.step)
        say = _say if main else _silent
        say(self.describe())
        for warning in self.warnings() if main else []:
            logger.warning("warning: %s", warning)
        if self.last_checkpoint is not None:
            say(f"resumed from {self.last_checkpoint} at step {self.step}")

        started, meter = time.perf_counter(), _Throughput(cfg.tokens_per_step)
        watch = DivergenceWatch(
            uniform_loss=math.log(self.model_config.vocab_size),
            watch_from=max(cfg.warmup_steps, self.step) + DivergenceWatch.span,
        )
        loss, last_eval, stop = math.nan, None, False
        bar = tqdm(total=cfg.steps, initial=self.step, desc="train", unit="step", disable=not (main and self.progress))
        with bar, self._stop_signals():
            while self.step < cfg.steps and not stop:
                tick = time.perf_counter()
                loss, grad_norm, stop = self.train_step()
                meter.add_step(time.perf_counter() - tick)
                diverged = watch.update(self.step, loss)  # the same on every rank: the loss is all-reduced
                if diverged is not None:
                    raise TrainingDiverged(self._finite_divergence_message(diverged, watch.onset or self.step))
                bar.update(1)
                done = self.step == cfg.steps
                # Not at a stop: the resumed run would log that step again only if it were a logging step.
                if self.step % cfg.log_interval == 0 or done:
                    tokens_per_s = meter.interval_rate()
                    bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
                    if main:
                        log(
                            {
                                "step": self.step,
                                "train_loss": loss,
                                "lr": learning_rate(self.step - 1, cfg),
                                "grad_norm": grad_norm,
                                "tokens": self.step * cfg.tokens_per_step,
                                "tokens_per_s": round(tokens_per_s, 1),
                            }
                        )
                if self.step % cfg.eval_interval == 0 or done:
                    last_eval = self.evaluate()
                    if main:
                        log({"step": self.step, **_prefixed("val_", last_eval.metrics())})
                    say(
                        f"step {self.step:>6} | train loss {loss:.4f} | val loss {last_eval.loss:.4f} | "
                        f"val bits/byte {last_eval.bits_per_byte:.3f}"
                    )
                if self.step % cfg.checkpoint_interval == 0 or done or stop:
                    self.save()
        if main:
            plot_losses(self.metrics.read(), self.run_dir / LOSS_PLOT, title=self._plot_title())
        result = TrainResult(
            run_dir=self.run_dir,
            step=self.step,
            # Also at the last step: a stop asked for then still stops what runs this (a compare, a script).
            interrupted_by=self._stop_signal,
            train_loss=loss,
            val=last_eval,
            tokens_per_second=meter.total_rate(),
            seconds=time.perf_counter() - started,
        )
        say(self._summary(result))
        return result

    def _plot_title(self) -> str:
        m = self.model_config
        return f"{m.attention} + {m.position}, {self.raw_model.num_parameters() / 1e6:.2f}M params, {self.corpus.name}"

    def _summary(self, result: TrainResult) -> str:
        if result.interrupted_by is not None:
            name = signal.Signals(result.interrupted_by).name
            if result.step == self.cfg.steps:
                return (
                    f"{name} during the last step: the run finished its {result.step} steps and saved "
                    f"{self.last_checkpoint}; stopping here"
                )
            return (
                f"{name}: stopped at step {result.step} and saved {self.last_checkpoint}. "
                f"Continue with: attnzoo train --resume {self.run_dir}"
            )
        if result.val is None:
            return f"nothing to do: the run already reached step {result.step}"
        return (
            f"done: step {result.step} in {result.seconds:.0f} s ({result.tokens_per_second:,.0f} tokens/s training). "
            f"val loss {result.val.loss:.4f}, perplexity {result.val.perplexity:.2f}, "
            f"{result.val.bits_per_byte:.3f} bits/byte\ncheckpoint {self.last_checkpoint}"
        )

    @contextlib.contextmanager
    def _stop_signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM ask the loop to stop after the current step and save.

        Repeats are absorbed rather than allowed to kill the save: torchrun forwards the Ctrl-C that its
        workers already received. SIGKILL (or Ctrl-\\) still ends a run at once.
        """
        if threading.current_thread() is not threading.main_thread():
            yield  # Python delivers signals to the main thread only
            return

        def request_stop(signum, frame):
            self._stop_signal = signum

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class _Throughput:
    """Training tokens per second, overall and since the last report; evaluation and checkpoints excluded."""

    def __init__(self, tokens_per_step: int):
        self.tokens_per_step = tokens_per_step
        self.steps, self.seconds = 0, 0.0
        self.interval_steps, self.interval_seconds = 0, 0.0

    def add_step(self, seconds: float) -> None:
        self.steps, self.seconds = self.steps + 1, self.seconds + seconds
        self.interval_steps, self.interval_seconds = self.interval_steps + 1, self.interval_seconds + seconds

    def interval_rate(self) -> float:
        rate = self.interval_steps * self.tokens_per_step / self.interval_seconds
        self.interval_steps, self.interval_seconds = 0, 0.0
        return rate

    def total_rate(self) -> float:
        return self.steps * self.tokens_per_step / self.seconds if self.seconds else math.nan


def _passes(tokens: int, train_tokens: int) -> str:
    """Said where a run reads its training split more than once: past one pass a model starts to memorise it."""
    return f" ({tokens / train_tokens:.1f} passes over the training split)" if tokens > train_tokens else ""


def _prefixed(prefix: str, values: dict) -> dict:
    return {prefix + key: value for key, value in values.items()}


def _say(message: str) -> None:
    tqdm.write(message)  # prints above the progress bar instead of through it
    sys.stdout.flush()  # so a log file being followed shows each line as it happens


def _silent(_: str) -> None:
    pass
