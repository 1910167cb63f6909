"""A language-model run's life in a comparison: planned, trained (or uptrained from a converted source, resumed,
reused), evaluated and probed, its record written last.

``OUT/runs/<variant>/seed<k>/`` holds a training run (see :mod:`attnzoo.training.trainer`), plus
``compare_run.json``, its evaluations, written last: the run is complete; and ``attention_maps.npy``, the first
seed's maps on the validation prompt. A run with a checkpoint short of the last step resumes from it (the trainer
makes exactly the updates of an uninterrupted run); one without a checkpoint starts over. A run directory that holds
a different model or training configuration is refused rather than overwritten.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnzoo.compare.provenance import provenance
from attnzoo.compare.spec import CompareSpec
from attnzoo.compare.stored import jsonable, read_record, write_record
from attnzoo.config import ModelConfig
from attnzoo.convert.directory import group_kv_heads
from attnzoo.data.corpora import Corpus
from attnzoo.distributed import Distributed
from attnzoo.evals.lm import LMEvalConfig, evaluate_lm, length_extrapolation, window_plan
from attnzoo.evals.probes import probe_model
from attnzoo.model import Transformer
from attnzoo.results.comparison import ATTENTION_MAPS, ExtrapolationResult, LMRun
from attnzoo.training.checkpoint import (
    Checkpoint,
    CheckpointError,
    latest_checkpoint,
    load_pretrained,
    read_checkpoint,
)
from attnzoo.training.config import TrainConfig
from attnzoo.training.metrics import MetricsLog
from attnzoo.training.trainer import METRICS, Trainer, check_resumable
from attnzoo.variants import Variant, matched_configs

RUN_RECORD = "compare_run.json"


class LMRuns:
    """The language-model runs of one comparison in ``out_dir``, on this process's place ``env`` among the
    processes of a run (rank 0 alone writes). ``executor`` names where they train, for their provenance; ``say``
    prints a line above any progress bar."""

    def __init__(
        self,
        spec: CompareSpec,
        out_dir: Path,
        env: Distributed,
        executor: str,
        progress: bool,
        say: Callable[[str], None],
    ):
        self.spec, self.out_dir, self.env, self.executor = spec, out_dir, env, executor
        self.progress, self.say = progress, say

    def configs(self, corpus: Corpus) -> dict[str, ModelConfig]:
        """Every variant's model, parameter-matched to the baseline's."""
        baseline = self.spec.baseline_config(corpus.tokenizer.vocab_size)
        return matched_configs(self.spec.variants, baseline)

    def plan(self, variant: Variant, seed: int) -> tuple[Path, TrainConfig, dict[str, Any]]:
        """Where a run lives, how it trains and how it is evaluated."""
        spec = self.spec
        train_config = dataclasses.replace(spec.train_for(variant), seed=seed, steps=variant.steps(spec.train.steps))
        if variant.uptrain is not None:
            train_config = uptraining_config(dataclasses.replace(spec.train, seed=seed), train_config.steps)
        evals = jsonable({**asdict(spec.evals), "maps": seed == spec.seeds[0]})
        return self.out_dir / "runs" / variant.label / f"seed{seed}", train_config, evals

    def finished(self, variant: Variant, seed: int) -> bool:
        """Whether the run's record is written, under this comparison's evaluations (its checkpoint is checked
        when the record is read back)."""
        run_dir, _, evals = self.plan(variant, seed)
        record = read_record(LMRun, run_dir / RUN_RECORD)
        return record is not None and evaluated_as_asked(record.evals, evals)

    def run(
        self, variant: Variant, config: ModelConfig, seed: int, corpus: Corpus
    ) -> tuple[LMRun | None, int | None, bool]:
        """Train (or reuse, or resume) one run and evaluate it: its record or the stopping signal, and whether
        the record was reused as it was."""
        run_dir, train_config, evals = self.plan(variant, seed)
        found = latest_checkpoint(run_dir)
        checkpoint = read_checkpoint(found) if found is not None else None
        if checkpoint is not None:
            try:
                check_resumable(checkpoint, config, train_config)
            except CheckpointError as err:
                raise CheckpointError(
                    f"{run_dir} holds a run with another configuration than this compare's: {err}. "
                    "Choose another output directory, or delete that run to retrain it."
                ) from None
        finished = checkpoint is not None and checkpoint.step == train_config.steps
        record = read_record(LMRun, run_dir / RUN_RECORD)
        if finished and record is not None and evaluated_as_asked(record.evals, evals):
            return record, None, True
        stale = checkpoint is None and run_dir.exists()
        self.env.barrier()  # every process of the run has read its directory before rank 0 changes it
        if stale and self.env.is_main:
            shutil.rmtree(run_dir)  # stopped before its first checkpoint: nothing in it can be continued

        if not finished:
            source = None
            if variant.uptrain is not None and checkpoint is None:
                source = self.converted_source(variant, seed)
            trainer = Trainer(
                config,
                train_config,
                corpus,
                run_dir,
                env=self.env,
                resume=checkpoint,
                init_from=source,
                progress=self.progress,
            )
            result = trainer.fit()
            if result.interrupted_by is not None:
                return None, result.interrupted_by, False
            model = trainer.raw_model
            if self.env.enabled and train_config.parallel == "fsdp":
                # FSDP2 sharded the model in place among the processes; the evaluations read its weights whole.
                model, _ = load_pretrained(run_dir, self.env.device)
        else:
            self.say(f"{run_dir} finished training earlier; evaluating it")
            model, _ = load_pretrained(run_dir, self.env.device)
        record = self.evaluate(model, variant.label, seed, train_config, corpus, run_dir, evals)
        if self.env.is_main:
            write_record(record, run_dir / RUN_RECORD)
        return record, None, False

    def converted_source(self, variant: Variant, seed: int) -> Checkpoint:
        """The same seed's trained source model with its kv heads mean-pooled (``attnzoo convert --kv-heads``): where
        an uptrained variant starts. The source trains first, since it is listed before (CompareSpec checks)."""
        source_dir = self.out_dir / "runs" / variant.source.label / f"seed{seed}"
        converted = self.out_dir / "runs" / variant.label / f"seed{seed}-converted"
        if self.env.is_main:
            shutil.rmtree(converted, ignore_errors=True)  # a conversion cut off midway is simply redone
            group_kv_heads(source_dir, converted, variant.n_kv_heads)  # type: ignore[arg-type]
        self.env.barrier()  # the other processes of the run read the conversion rank 0 wrote
        return read_checkpoint(converted)

    def extrapolation_tokens(self, corpus: Corpus) -> np.ndarray:
        """The start of the validation split that every length is scored on: whole blocks of the longest."""
        evals = self.spec.evals
        longest = max(evals.extrapolation_multiples) * self.spec.train.seq_len
        n_tokens = evals.extrapolation_blocks * longest + 1
        if len(corpus.val) < n_tokens:
            raise ValueError(
                f"the validation split of {corpus.name!r} has {len(corpus.val):,} tokens; length extrapolation "
                f"needs {n_tokens:,} ({evals.extrapolation_blocks} blocks of {longest}): use more text"
            )
        return np.asarray(corpus.val[:n_tokens], dtype=np.int64)

    def evaluate(
        self,
        model: Transformer,
        label: str,
        seed: int,
        train_config: TrainConfig,
        corpus: Corpus,
        run_dir: Path,
        evals: dict[str, Any],
    ) -> LMRun:
        spec, device = self.spec, self.env.device
        started = time.perf_counter()
        token_bytes = corpus.tokenizer.token_bytes()
        # Every run is scored on the same tokens, at the comparison's length and its multiples, whatever length it
        # trained at (+lenN): the whole validation split, in contiguous blocks whose losses let the verdicts count
        # the text's sampling noise as well as the seeds'; the trainer's curve scored a sample of its windows.
        length = spec.train.seq_len
        val_config = LMEvalConfig(length, batch_size=spec.train.batch_size, max_windows=spec.evals.val_windows)
        windows_scored = len(window_plan(len(corpus.val), val_config)[0]) // self.env.world_size * self.env.world_size
        blocks = min(spec.evals.val_blocks, windows_scored)
        val = evaluate_lm(model, corpus.val, token_bytes, val_config, env=self.env, blocks=blocks)
        extrapolation_config = LMEvalConfig(length, batch_size=spec.evals.extrapolation_batch_size)
        points = length_extrapolation(
            model,
            self.extrapolation_tokens(corpus),
            token_bytes,
            extrapolation_config,
            spec.evals.extrapolation_multiples,
            blocks=spec.evals.extrapolation_blocks,
        )
        windows = np.asarray(corpus.val[: spec.evals.probe_windows * length], dtype=np.int64)
        probes = lm_probes(model, torch.from_numpy(windows).view(-1, length))
        has_maps = seed == spec.seeds[0]
        if has_maps and self.env.is_main:
            prompt = torch.from_numpy(np.asarray(corpus.val[: spec.evals.map_tokens], dtype=np.int64))[None]
            model.eval()
            maps = model.attention_maps(prompt.to(device))  # each (1, heads, T, T): the effective, mixing map
            np.save(run_dir / ATTENTION_MAPS, torch.stack([m[0] for m in maps]).cpu().numpy())
        metrics = MetricsLog(run_dir / METRICS).read()
        train_records = [r for r in metrics if "train_loss" in r]
        self.say(
            f"evaluated {label} seed {seed} in {time.perf_counter() - started:.1f} s: val loss {val.loss:.4f}, "
            + ", ".join(f"{p.multiple}×: {p.result.loss:.3f}" if p.result else f"{p.multiple}×: N/A" for p in points)
        )
        return LMRun(
            variant=label,
            seed=seed,
            run_dir=str(run_dir.relative_to(self.out_dir)),
            parameters=model.num_parameters(),
            steps=train_config.steps,
            tokens=train_config.steps * train_config.tokens_per_step,
            train_seconds=_training_seconds(train_records, train_config.tokens_per_step),
            final_train_loss=train_records[-1]["train_loss"],
            final_lr=train_records[-1]["lr"],
            val=val,
            extrapolation=[ExtrapolationResult(p.multiple, p.block_len, p.result, p.reason) for p in points],
            train_curve=[(r["step"], r["train_loss"]) for r in train_records],
            val_curve=[(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r],
            evals=evals,
            has_maps=has_maps,
            probes=probes,
            provenance=provenance(self.env.device, self.executor),
        )


def evaluated_as_asked(stored: dict[str, Any], asked: dict[str, Any]) -> bool:
    """Whether a run's evaluations are the ones asked for. A run that also kept its attention maps (the first seed
    of the comparison it was made in, e.g. one part of a merged comparison) is as good as one without."""
    return {**stored, "maps": asked["maps"]} == asked and stored["maps"] >= asked["maps"]


def uptraining_config(pretraining: TrainConfig, steps: int) -> TrainConfig:
    """GQA uptraining as Ainslie et al. (2023, arXiv 2305.13245) describe it: the pre-training recipe again, for a
    fraction α of its steps (``steps``). The converted model's fresh optimiser re-warms to the peak learning rate
    over the same share of its steps as pre-training's warmup and decays on the same cosine to the same floor;
    it is evaluated four times so the gates can read its curve."""
    schedule = pretraining.with_steps(steps)
    return dataclasses.replace(
        schedule,
        warmup_steps=min(max(1, schedule.warmup_steps), steps - 1),
        eval_interval=max(1, steps // 4),
        checkpoint_interval=steps,
    )


def lm_probes(model: Transformer, windows: Tensor) -> dict[str, float]:
    """The trained model's probes (attnzoo.evals.probes) as flat values: each layer's, and the summaries the
    claims read: the largest attention logit and hidden-state outlier ratio over layers, and the spikiness of
    rows that see at least half the window (a local layer's longest rows, where its window is shorter),
    averaged over layers."""
    layers = probe_model(model, windows)
    values = {
        f"layer{p.layer}/{name}": getattr(p, name)
        for p in layers
        for name in ("top_logit", "hidden_top", "hidden_ratio", "entropy", "spikiness")
    }
    half = windows.shape[1] // 2
    long_rows = []
    for p in layers:
        # Buckets are lengths [low, 2·low − 1]; in a fresh causal window each length up to T has one row.
        buckets = [(int(b.split("-")[0]), v) for b, v in p.spikiness_by_length.items() if b != "1"]
        weighted = [(min(2 * low - 1, windows.shape[1]) - low + 1, v) for low, v in buckets if low >= half]
        weighted = weighted or [(1, buckets[-1][1])]
        long_rows.append(sum(n * v for n, v in weighted) / sum(n for n, _ in weighted))
    return values | {
        "top1_attention_logit": max(p.top_logit for p in layers),
        "hidden_outlier_ratio": max(p.hidden_ratio for p in layers),
        "spikiness_long": sum(long_rows) / len(long_rows),
    }


def _training_seconds(train_records: list[dict[str, Any]], tokens_per_step: int) -> float:
    """Time spent in training steps, from the throughput logged with each record: evaluation, checkpoints
    and the steps of an interrupted session that a resume redid are not counted."""
    seconds, previous = 0.0, 0
    for record in train_records:
        seconds += (record["step"] - previous) * tokens_per_step / record["tokens_per_s"]
        previous = record["step"]
    return seconds
